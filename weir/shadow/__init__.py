"""Shadow runs: a candidate version of a processor run beside the live one, on the same batches of the same input,
writing topics of its own, and compared with the live outputs over what both have settled (`weir shadow`,
docs/releases.md "Shadow runs")."""
