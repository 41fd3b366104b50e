from __future__ import annotations

import getpass
import os
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from approvals.models import Membership, Tenant


class Command(BaseCommand):
    help = "Give a user a role in a tenant, creating the user if missing."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("username")
        parser.add_argument("--role", required=True, choices=Membership.Role.values)
        parser.add_argument(
            "--password-env",
            metavar="VAR",
            help="Read the new user's password from this environment variable.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["slug"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['slug']!r}.")
        User = get_user_model()
        username = options["username"]
        user = User.objects.filter(username=username).first()
        if user is None:
            candidate = User(username=username)
            try:
                # create_user() validates neither the username nor the password.
                User._meta.get_field("username").clean(username, candidate)
                password = self._password(options["password_env"])
                validate_password(password, candidate)
            except ValidationError as exc:
                raise CommandError(" ".join(exc.messages)) from None
            user = User.objects.create_user(username=username, password=password)
            self.stdout.write(f"Created user {user.username}.")
        elif options["password_env"]:
            self.stdout.write(f"User {user.username} exists; their password is unchanged.")
        _, created = Membership.objects.get_or_create(
            user=user, tenant=tenant, role=options["role"]
        )
        state = "Added" if created else "Already had"
        self.stdout.write(f"{state} role {options['role']} for {user.username} in {tenant.slug}.")

    def _password(self, var: str | None) -> str:
        if var:
            value = os.environ.get(var)
            if not value:
                raise CommandError(f"The environment variable {var} is empty or unset.")
            return value
        password = getpass.getpass("Password: ")
        if not password or password != getpass.getpass("Password (again): "):
            raise CommandError("The passwords are empty or differ.")
        return password
