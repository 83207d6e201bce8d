"""The rule language: typed models, the YAML loader, the SQL-subset expression
compiler and the pure per-key evaluator. Nothing here imports Kafka, Faust or Spark."""
