"""`corral dashboard`: the web dashboard's address and a fresh one-time login link (docs/dashboard.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from corral.cli.remote import JsonOpt, ServerOpt, TokenOpt, connect, print_json
from corral.cli.root import app

if TYPE_CHECKING:
    from corral.client import Client


def login_link(corral: Client) -> str:
    """A one-time link that signs a browser in as this client's token (valid for an hour)."""
    made = corral.request("POST", "/v1/login-links")
    return f"{corral.server}{made['path']}"


@app.command(rich_help_panel="Control plane")
def dashboard(
    ctx: typer.Context,
    open_browser: Annotated[bool, typer.Option("--open", help="open the link in your web browser")] = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the dashboard's URL and a one-time login link that signs in as your token."""
    with connect(ctx, server, token) as corral:
        link = login_link(corral)
        url = f"{corral.server}/"
    if as_json:
        print_json({"url": url, "login_link": link, "expires_in": 3600})
        return
    typer.echo(f"Dashboard: {url}\nOne-time login link (valid for an hour, works once): {link}")
    if open_browser:
        import webbrowser

        webbrowser.open(link)
