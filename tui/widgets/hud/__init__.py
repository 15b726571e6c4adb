"""Widgets and screens of the chat app."""
