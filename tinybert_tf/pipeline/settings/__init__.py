"""The pipeline's typed settings and the dtype decisions they hold."""
