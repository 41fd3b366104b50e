"""The operators' pages: the queue, an occurrence's timeline with the operator actions,
investigations, and the admins' adapter credentials."""
