"""The Textual TUI. Imports textual and the analyzer, never bcc."""
