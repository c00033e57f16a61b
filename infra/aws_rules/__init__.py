"""What AWS decides and the program keeps to, declared once with its source: limits and names
(node repair, Container Insights, the node groups' AMI types, the VPC's address layout), and pure
judgements over facts fetched elsewhere (capacity, a reservation's window in dates, what a live
stack may still change, the pods' sizes, the images' digests). Nothing here reads AWS, a registry
or the engine: the preview's reads are `infra.preflight` (its `reads` subpackage for these
judgements' facts), the planner's `infra.planner` and `infra.region_survey`."""
