"""Generated from proto/ by clients/generate.sh; do not edit."""
