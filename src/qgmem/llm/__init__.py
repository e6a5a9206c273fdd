"""LLM access shared by every stage: backends (HTTP, local transformers), a replayable cache, prompts
and JSON parsing of replies. Import concrete classes from :mod:`qgmem.llm.backends`."""
