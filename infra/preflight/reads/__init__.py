"""The preview's reads that feed the judgements of `infra.aws_rules`, each a thin layer that fetches
facts and hands them over:

- `live_stack`: what already runs under the stack's names (AWS provider data sources);
- `instance_types`: an instance type's facts (`ec2:DescribeInstanceTypes`);
- `image_digests`: each image tag's digest from its registry (HTTP), an ECR token, and the digests
  the stack recorded (the engine's `readStackOutputs`).
"""
