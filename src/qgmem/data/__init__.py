"""Conversation data layer: typed records and loaders for ConvoMem, LoCoMo and LongMemEval."""
