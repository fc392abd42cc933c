"""The generator role's service, its client, and the endpoint record that joins them."""
