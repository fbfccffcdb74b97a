"""The verifier: loading any causal LM and its tokenizer, its families and offline facts (read
without torch, by the config gate too), a GGUF file converted once, the embedded verifier, and its
attention (workflow/rules/verifier.smk)."""
