"""Answer text rules shared by every stage: one normalizer, exact match, token F1, abstention."""

from qgmem.text.answers import (ABSTAIN_PHRASES, contains_answer, exact_match, is_abstention, normalize_answer,
                                strip_thinking, token_f1)

__all__ = ["ABSTAIN_PHRASES", "contains_answer", "exact_match", "is_abstention", "normalize_answer",
           "strip_thinking", "token_f1"]
