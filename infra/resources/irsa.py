"""IAM roles for service accounts (IRSA): a role that one Kubernetes service account, and nothing
else, assumes through the cluster's OIDC provider.

The Ray pods (the checkpoints), the CloudWatch agent and the VPC CNI (`aws-node`) each get one
(EKS user guide, "Assign IAM roles to Kubernetes service accounts": the trust policy's
`StringEquals` on the issuer's `:sub` and `:aud`).
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

# The audience EKS's pod identity webhook puts in the service account token (its default
# `eks.amazonaws.com/audience`, amazon-eks-pod-identity-webhook README).
STS_AUDIENCE = "sts.amazonaws.com"


def irsa_trust_policy(
    oidc_provider_arn: str, oidc_provider_url: str, namespace: str, service_account: str
) -> str:
    """Trust the cluster's OIDC provider, for one service account only."""
    issuer = oidc_provider_url.removeprefix("https://")
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Federated": oidc_provider_arn},
                    "Action": "sts:AssumeRoleWithWebIdentity",
                    "Condition": {
                        "StringEquals": {
                            f"{issuer}:sub": f"system:serviceaccount:{namespace}:{service_account}",
                            f"{issuer}:aud": STS_AUDIENCE,
                        }
                    },
                }
            ],
        }
    )


def irsa_role(
    name: str,
    *,
    oidc_provider_arn: pulumi.Input[str],
    oidc_provider_url: pulumi.Input[str],
    namespace: str,
    service_account: str,
    opts: pulumi.ResourceOptions,
) -> aws.iam.Role:
    """The role `namespace:service_account` assumes, trusted by the cluster's OIDC provider alone."""
    return aws.iam.Role(
        name,
        assume_role_policy=pulumi.Output.all(oidc_provider_arn, oidc_provider_url).apply(
            lambda args: irsa_trust_policy(args[0], args[1], namespace, service_account)
        ),
        opts=opts,
    )
