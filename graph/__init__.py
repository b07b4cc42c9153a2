"""The LangGraph state machine of the co-evolution loop (see the loop issue)."""
