"""`polar bench`: measure what the proxy costs (overhead, growth, concurrency, builder, grading)."""
