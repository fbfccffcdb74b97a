"""The verifier: loading any causal LM and its tokenizer, a GGUF file converted once, the embedded
verifier, and its attention (workflow/rules/verifier.smk)."""
