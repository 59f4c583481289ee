"""Other GPU hosts reached over the user's own OpenSSH client (issue 26 item 1).

`hosts` reads ``<config>/hosts.toml``; `link` runs our own headless CLI there (`SshLink`) or here
(`LocalLink`); `client` speaks that CLI's JSON contracts and checks versions; `monitor` polls every host
in its own thread so that a slow or lost host never blocks the TUI.
"""


def local_version() -> str:
    """This installation's version (the package metadata: pyproject's ``version``); here, not in
    `client`, so that ``eagle3-tui --help`` and ``--version`` import nothing else."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("eagle3-tui")
    except PackageNotFoundError:
        return "unknown"
