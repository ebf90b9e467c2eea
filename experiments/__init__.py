"""Experiments on the method: each a package run as `python -m experiments.<name>`, built on
`cobalt`, `engines` and `sandbox` (never on `tasks` or `flows`); nothing else imports them."""
