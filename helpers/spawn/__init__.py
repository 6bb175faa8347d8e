"""Starting runs: one training process (runner), or msrun's data-parallel ranks and their merge."""
