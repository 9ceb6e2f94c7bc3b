"""Small private helpers shared by every layer, one purpose per module (files, jsonio, names, text, machine)."""
