"""`polar view`: one self-contained HTML page to see what each episode trained on, token by token."""
