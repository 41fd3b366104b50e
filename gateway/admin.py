"""The gateway's journal in ``/admin/``, read-only: what each gated call reached, for
staff who look into a call. Only the gateway's own steps change it."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from gateway.models import GatewayCall


@admin.register(GatewayCall)
class GatewayCallAdmin(admin.ModelAdmin):
    list_display = ("created_at", "gateway", "upstream", "upstream_tool", "state", "outcome")
    list_filter = ("gateway", "state", "outcome")
    search_fields = ("execution_id", "session_id", "occurrence__id")
    readonly_fields = [f.name for f in GatewayCall._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
