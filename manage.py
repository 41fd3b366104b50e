#!/usr/bin/env python
import os
import secrets
import sys

# Commands that read the models and never sign, encrypt or serve anything: they may run
# without the deployment's SECRET_KEY (the settings refuse to load without one when DEBUG
# is off), on a throwaway key that lives as long as the process.
KEYLESS_COMMANDS = {"makemigrations", "showmigrations", "sqlmigrate"}


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    if len(sys.argv) > 1 and sys.argv[1] in KEYLESS_COMMANDS:
        os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
