"""IAM roles for service accounts: each role of the plan that a pod assumes trusts the cluster's OIDC
provider for one service account, `StringEquals` on both the token's subject and its audience."""

from __future__ import annotations

import json

from infra.aws_rules.container_insights import AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT
from infra.resources.irsa import irsa_trust_policy
from platform_contract import RAY_SERVICE_ACCOUNT
from tests.harness.program import ACCOUNT

ISSUER = "oidc.eks.us-east-2.amazonaws.com/id/0123456789ABCDEF"
PROVIDER = f"arn:aws:iam::{ACCOUNT}:oidc-provider/{ISSUER}"


def test_the_trust_names_one_service_account_and_the_sts_audience_exactly():
    # The issuer as pulumi-eks gives it, with or without its scheme.
    for url in (ISSUER, f"https://{ISSUER}"):
        [statement] = json.loads(irsa_trust_policy(PROVIDER, url, "ns", "sa"))["Statement"]
        assert statement == {
            "Effect": "Allow",
            "Principal": {"Federated": PROVIDER},
            "Action": "sts:AssumeRoleWithWebIdentity",
            "Condition": {
                "StringEquals": {
                    f"{ISSUER}:sub": "system:serviceaccount:ns:sa",
                    f"{ISSUER}:aud": "sts.amazonaws.com",
                }
            },
        }


def test_every_role_a_pod_assumes_is_one_service_accounts(stack_plan):
    config, plan = stack_plan
    region = config["aws:region"]
    namespace = config.get("eks-ray-train:namespace", "ray-train")
    issuer = f"oidc.eks.{region}.amazonaws.com/id/0123456789ABCDEF"
    provider = f"arn:aws:iam::{ACCOUNT}:oidc-provider/{issuer}"
    trusted = {}
    for role in plan.of_type("aws:iam/role:Role"):
        [statement] = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
        if statement["Action"] == "sts:AssumeRoleWithWebIdentity":
            assert statement["Principal"] == {"Federated": provider}, role.name
            conditions = statement["Condition"]["StringEquals"]
            assert conditions[f"{issuer}:aud"] == "sts.amazonaws.com", role.name
            trusted[role.name] = conditions[f"{issuer}:sub"]
    assert trusted == {
        f"{config['eks-ray-train:clusterName']}-vpc-cni": "system:serviceaccount:kube-system:aws-node",
        "checkpoints-ray-pods": f"system:serviceaccount:{namespace}:{RAY_SERVICE_ACCOUNT}",
        "observability-agent": f"system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_SERVICE_ACCOUNT}",
    }
