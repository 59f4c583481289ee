"""Other GPU hosts reached over the user's own OpenSSH client (issue 26 item 1).

`hosts` reads ``<config>/hosts.toml``; `link` runs our own headless CLI there (`SshLink`) or here
(`LocalLink`); `client` speaks that CLI's JSON contracts and checks versions; `monitor` polls every host
in its own thread so that a slow or lost host never blocks the TUI.
"""
