"""Reads of the effects side: commands as the API shows them, the operators' queue, an
occurrence's timeline."""
