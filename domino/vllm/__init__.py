"""The vLLM backend, in vLLM's own environment: serving and extraction, the plugin, the
hidden-states connector (workflow/rules/vllm.smk). Inside this package ``import vllm`` is vLLM
itself (absolute imports)."""
