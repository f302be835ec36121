"""The paper's tables: their cells, seeds, files and the bin/reproduce driver."""
