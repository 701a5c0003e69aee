"""Structure-aware fuzzing of program files against a plain numpy reference evaluator."""
