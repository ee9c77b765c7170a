"""Reports built from adapters: the bias-change heat map and the model card. Pure: no network."""
