"""The broker configuration: typed sections, documented field by field, validated at load."""
