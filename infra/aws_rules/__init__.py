"""What AWS decides and the program keeps to, declared once with its source: limits and names
(node repair, Container Insights), and pure judgements over facts fetched elsewhere (capacity,
a reservation's window in dates, what a live stack may still change, the pods' sizes); and the
images' digests, read from their registries at preview and kept (`image_pins`, its fetch layer
beside its judgements)."""
