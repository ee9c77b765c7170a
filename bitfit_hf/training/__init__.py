"""Training: the trainer core, its optimizer groups and the checks of distributed launches."""
