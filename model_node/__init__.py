"""Model-node role: inference engines, HR-tree prefix index, forwarding among model nodes."""
