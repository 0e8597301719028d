"""The egress proxy (issue 27): every connection a sandboxed tree makes goes through it."""
