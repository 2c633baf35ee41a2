"""`ddplab hosts`: a test cluster of hosts with their own addresses on this machine (ddplab/launch/hosts.py)."""

from __future__ import annotations

import argparse
import os

from ddplab.errors import ConfigError
from ddplab.io.arguments import (
    positive_whole,
)


def cmd_hosts(args: argparse.Namespace) -> int:
    """A test cluster of hosts with their own addresses on this machine (ddplab/launch/hosts.py)."""
    from ddplab.launch import hosts

    if args.action == "up":
        made = hosts.up(args.count, args.link, name=args.name)
        print(f"{made.hosts} host(s) up in cluster {made.name!r}, each link {hosts.rate_text(made.rate_bit_s)}:")
    elif args.action == "down":
        stopped = hosts.down(args.name)
        print(
            f"cluster {args.name!r} is down" + (f"; {len(stopped)} process(es) in it were stopped" if stopped else "")
        )
        return 0
    elif args.action == "link":
        made = hosts.find(args.name)
        made.host(args.host)  # names the hosts there are
        hosts.set_link(made, args.host, args.state)
    elif args.action == "shape":
        made = hosts.reshape(args.name, args.rate)
    elif args.action == "exec":
        command = list(args.cmd)
        while command[:1] == ["--name"] and len(command) > 1:  # after I, the rest is the command's, but for --name
            args.name, command = command[1], command[2:]
        made = hosts.find(args.name)
        command = command[1:] if command[:1] == ["--"] else command
        if not command:
            raise ConfigError("ddplab hosts exec I -- COMMAND: no command given")
        os.execvp("ip", [*made.exec_prefix(args.host), *command])
    for row in hosts.status(args.name):
        print(
            f"  host {row['host']}  {row['address']:<12} link {row['link']:<4} {row['rate']:<9} "
            f"{row['processes']} process(es)   run in it: ddplab hosts exec {row['host']} -- CMD"
        )
    if args.action == "up":
        print(
            f"a run across them: ddplab hosts exec I -- ddplab train ... --nnodes {made.hosts} "
            f"--rdzv-endpoint {made.endpoint()}   (I = 0..{made.hosts - 1}); ddplab hosts down when done"
        )
    return 0


def add_hosts(sub) -> None:
    p = sub.add_parser(
        "hosts",
        help="a test cluster on this machine: hosts with their own addresses and links of a set "
        "rate (network namespaces; needs root)",
    )
    hosts_sub = p.add_subparsers(dest="action", required=True)
    q = hosts_sub.add_parser("up", help="make N hosts on a switch, at 10.211.0.1, .2, ...")
    q.add_argument("count", type=positive_whole, metavar="N")
    q.add_argument(
        "--link",
        default=None,
        metavar="RATE",
        help="each host's link rate, both ways: 100mbit, 1gbit, ... (default: unshaped)",
    )
    q = hosts_sub.add_parser("down", help="stop what runs in the hosts and remove them")
    q = hosts_sub.add_parser("status", help="each host's address, link and processes")
    q = hosts_sub.add_parser("link", help="pull a host's cable (down) or plug it back (up)")
    q.add_argument("host", type=int, metavar="I")
    q.add_argument("state", choices=("up", "down"))
    q = hosts_sub.add_parser("shape", help="set every link's rate (or none)")
    q.add_argument("rate", metavar="RATE")
    q = hosts_sub.add_parser("exec", help="run a command in host I")
    q.add_argument("host", type=int, metavar="I")
    q.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD")
    for q in hosts_sub.choices.values():
        q.add_argument(
            "--name", default="ddplab", help="the cluster's name (default ddplab); several may exist at once"
        )
    p.set_defaults(func=cmd_hosts)
