"""LLM access shared by every stage: backends (HTTP, local transformers), a replayable cache, prompts
and JSON parsing of replies. Import concrete classes from :mod:`qgmem.llm.backends`.

Text in, text out. Loading a causal LM's weights into this process (the frozen LM of training and
serving) is :mod:`qgmem.lm`, on the ground floor, which the local backend uses."""
