"""The command line; the only package that sees argparse (nothing imports it)."""
