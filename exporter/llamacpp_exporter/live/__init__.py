"""Commands that talk to running processes: ``top`` is the table of a running exporter's
conversations, ``check-lora-restore`` asks a running llama-server whether its build has the LoRA
restore bug."""
