"""The stack's AWS identity: the AWS provider's `aws:` settings, parsed once, honoured or refused.

Everything that talks to the cluster acts as the identity the AWS provider uses for the rest of
the stack: the program's Kubernetes provider (its kubeconfig runs `aws eks get-token` with the
profile and role, `infra.config.stack`) and the TrainingRun's dynamic provider (which signs its own
Kubernetes token and gets the stack config from the engine). These `aws:` keys are read the way
the AWS provider reads them (pulumi-aws provider configuration,
https://www.pulumi.com/registry/packages/aws/installation-configuration/):

- `aws:profile`: a named profile of the shared config files;
- `aws:accessKey`, `aws:secretKey`, `aws:token`: static keys (they win over the profile);
- `aws:assumeRole` (one role) and `aws:assumeRoles` (a chain, assumed in order) with `roleArn`,
  `sessionName`, `externalId`, `duration` (`1h`, `15m`) or `durationSeconds`, `policy`,
  `policyArns`, `tags`, `transitiveTagKeys`, `sourceIdentity`. The role credentials refresh
  themselves before they expire, so a run longer than the role's session still signs tokens.

Settings that would pick another identity and are not implemented here are refused at preview
with the key named (`REFUSED`), rather than ignored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import boto3
import botocore.credentials
import botocore.exceptions
import botocore.session

REFUSED = {
    "aws:assumeRoleWithWebIdentity": "web-identity roles are not supported by the training run",
    "aws:sharedCredentialsFiles": "set AWS_SHARED_CREDENTIALS_FILE in the environment instead",
    "aws:sharedConfigFiles": "set AWS_CONFIG_FILE in the environment instead",
}
_ROLE_FIELDS = {
    "roleArn": "RoleArn",
    "sessionName": "RoleSessionName",
    "externalId": "ExternalId",
    "policy": "Policy",
    "policyArns": "PolicyArns",
    "tags": "Tags",
    "transitiveTagKeys": "TransitiveTagKeys",
    "sourceIdentity": "SourceIdentity",
    "duration": "DurationSeconds",
    "durationSeconds": "DurationSeconds",
}
_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
DEFAULT_SESSION_NAME = "eks-ray-train-training-run"


class AwsSettingsError(ValueError):
    """An `aws:` setting the training run cannot honour; `key` names it."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key, self.reason = key, reason


@dataclass(frozen=True)
class AssumedRole:
    """One role of `aws:assumeRole`/`aws:assumeRoles`, as STS AssumeRole parameters."""

    parameters: tuple[tuple[str, Any], ...]

    @property
    def role_arn(self) -> str:
        return dict(self.parameters)["RoleArn"]

    def request(self) -> dict[str, Any]:
        return {"RoleSessionName": DEFAULT_SESSION_NAME, **dict(self.parameters)}


# TrainingRun states stored by the releases of 2026-12-04 and 2026-12-05 name this class here
# ("The stored provider", workloads/training_run/provider.py): it stays importable from this module.
@dataclass(frozen=True)
class AwsCredentialSettings:
    """The identity settings of the stack, typed; the secret key and session token left out of its repr."""

    profile: str | None = None
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    roles: tuple[AssumedRole, ...] = ()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> AwsCredentialSettings:
        """Parse the stack config the engine hands the provider; raises `AwsSettingsError`."""
        for key, reason in REFUSED.items():
            if config.get(key) not in (None, "", [], {}):
                raise AwsSettingsError(key, f"not honoured by the training run: {reason}")
        access_key, secret_key = config.get("aws:accessKey"), config.get("aws:secretKey")
        if bool(access_key) != bool(secret_key):
            missing = "aws:secretKey" if access_key else "aws:accessKey"
            raise AwsSettingsError(missing, "static keys need both aws:accessKey and aws:secretKey")
        roles = []
        if config.get("aws:assumeRole") not in (None, ""):
            roles.append(_role("aws:assumeRole", _json(config["aws:assumeRole"])))
        chain = _json(config.get("aws:assumeRoles") or [])
        if not isinstance(chain, list):
            raise AwsSettingsError("aws:assumeRoles", "must be a list of roles")
        roles += [_role(f"aws:assumeRoles[{index}]", role) for index, role in enumerate(chain)]
        return cls(
            profile=config.get("aws:profile") or None,
            access_key=access_key or None,
            secret_key=secret_key or None,
            token=config.get("aws:token") or None,
            roles=tuple(roles),
        )

    def kubeconfig_identity(self) -> tuple[str | None, str | None]:
        """The profile and role for the cluster's kubeconfig (`aws eks get-token --profile
        --role-arn`), which takes one role and reads keys only from the environment."""
        if self.access_key:
            raise AwsSettingsError(
                "aws:accessKey",
                "the cluster's kubeconfig (`aws eks get-token`) cannot read keys from stack config: "
                "export AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) instead",
            )
        if len(self.roles) > 1:
            raise AwsSettingsError(
                "aws:assumeRoles",
                f"chains {len(self.roles)} roles, and the cluster's kubeconfig (`aws eks get-token "
                "--role-arn`) assumes one: put the chain's first roles in an AWS CLI profile (role_arn, "
                "source_profile), set aws:profile to it, and keep only the last role",
            )
        return self.profile, self.roles[0].role_arn if self.roles else None

    def describe(self) -> str:
        """Where the identity comes from, for messages (no secret)."""
        if self.roles:
            base = self.roles[-1].role_arn
            return f"role {base} (aws:assumeRole{'s' if len(self.roles) > 1 else ''})"
        if self.access_key:
            return f"access key {self.access_key[:4]}... (aws:accessKey)"
        if self.profile:
            return f"profile {self.profile} (aws:profile)"
        return "the ambient AWS credentials (environment, default profile or instance role)"

    def session(self, region: str) -> boto3.session.Session:
        """A boto3 session with these credentials; assumed roles refresh before they expire."""
        session = boto3.session.Session(
            profile_name=None if self.access_key else self.profile,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            aws_session_token=self.token,
            region_name=region,
        )
        for role in self.roles:
            session = _assume(session, role, region)
        return session


def _json(value: Any) -> Any:
    """Object settings arrive as JSON text from the stack config."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _duration_s(key: str, value: Any) -> int:
    if isinstance(value, (int, float)):
        return int(value)
    match = _DURATION.fullmatch(str(value))
    if not value or not match:
        raise AwsSettingsError(key, f"duration {value!r} is not like 1h, 15m or 3600")
    hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def _role(key: str, value: Any) -> AssumedRole:
    if not isinstance(value, dict) or not value.get("roleArn"):
        raise AwsSettingsError(key, "needs a roleArn")
    unknown = sorted(set(value) - set(_ROLE_FIELDS))
    if unknown:
        raise AwsSettingsError(key, f"field(s) {', '.join(unknown)} not honoured by the training run")
    parameters: dict[str, Any] = {}
    for name, item in value.items():
        if name in ("duration", "durationSeconds"):
            item = _duration_s(f"{key}.{name}", item)
        elif name == "policyArns":
            item = [{"arn": arn} for arn in item]
        elif name == "tags":
            item = [{"Key": tag, "Value": tag_value} for tag, tag_value in item.items()]
        parameters[_ROLE_FIELDS[name]] = item
    return AssumedRole(tuple(sorted(parameters.items())))


def _assume(base: boto3.session.Session, role: AssumedRole, region: str) -> boto3.session.Session:
    sts = base.client("sts", region_name=region)

    def fetch() -> dict[str, str]:
        credentials = sts.assume_role(**role.request())["Credentials"]
        return {
            "access_key": credentials["AccessKeyId"],
            "secret_key": credentials["SecretAccessKey"],
            "token": credentials["SessionToken"],
            "expiry_time": credentials["Expiration"].isoformat(),
        }

    refreshable = botocore.credentials.RefreshableCredentials.create_from_metadata(
        metadata=fetch(), refresh_using=fetch, method="assume-role"
    )
    core = botocore.session.Session()
    # botocore has no public setter for a session's credentials; this is how boto3 itself wires them.
    core._credentials = refreshable
    return boto3.session.Session(botocore_session=core, region_name=region)


def caller_identity(
    session: boto3.session.Session, region: str, config: Any
) -> tuple[str | None, str | None]:
    """(the ARN the session acts as, STS's error code) from STS GetCallerIdentity; (None, None)
    when STS cannot be asked (no credentials, unreachable)."""
    try:
        return session.client("sts", region_name=region, config=config).get_caller_identity()["Arn"], None
    except botocore.exceptions.ClientError as error:
        return None, error.response.get("Error", {}).get("Code", "")
    except botocore.exceptions.BotoCoreError:
        return None, None
