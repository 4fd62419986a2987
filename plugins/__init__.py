"""First-party components, registered through the same entry-point path as any plugin."""
