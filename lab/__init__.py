"""The network lab and the research around the recipe (lab/README.md): it imports the product, never the reverse."""
