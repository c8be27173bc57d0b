"""What a fresh Debian machine holds after scripts/run.sh's own install step: the packages
`scripts/setup.sh --list-packages` names, everything they depend on (Depends and Pre-Depends,
followed through virtual packages to the installed provider), and the essential packages
every Debian has. This machine has more (the tests' packages); the README walk runs the
Quickstart's commands as if it had only these:

  - Python's imports: a module under Debian's dist-packages that none of these packages
    installed is missing (sitecustomize/sitecustomize.py refuses it, as a fresh machine's
    python3 would), so scripts/plot_metrics fails where run.sh did not install matplotlib;
  - the programs: a command's program (or a script's interpreter, from its #! line) that
    belongs to a Debian package must belong to one of these.

Standard library only.
"""
import os
import re
import shutil
import subprocess

SITECUSTOMIZE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sitecustomize")


def installed():
    """{package: (essential, [[alternatives] of Depends and Pre-Depends], [provided])}."""
    out = subprocess.run(["dpkg-query", "-W", "-f=${Package}\t${Essential}\t${Pre-Depends}\t"
                          "${Depends}\t${Provides}\t${db:Status-Status}\n"],
                         stdout=subprocess.PIPE, text=True, check=True).stdout
    packages = {}
    for line in out.splitlines():
        name, essential, pre, depends, provides, status = line.split("\t")
        if status != "installed":
            continue
        groups = [[re.sub(r"[ (:].*", "", alt.strip()) for alt in group.split("|")]
                  for group in ", ".join(d for d in (pre, depends) if d).split(",") if group.strip()]
        provided = [re.sub(r"[ (].*", "", p.strip()) for p in provides.split(",") if p.strip()]
        packages[name] = (essential == "yes", groups, provided)
    return packages


def closure(wanted):
    """The installed packages `wanted` brings, with their dependencies and the essential ones."""
    packages = installed()
    providers = {}
    for name, (_, _, provided) in packages.items():
        for virtual in provided:
            providers.setdefault(virtual, []).append(name)
    todo = [p for p in wanted if p in packages] + [p for p, v in packages.items() if v[0]]
    seen = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for group in packages[name][1]:
            for alternative in group:
                found = [alternative] if alternative in packages else providers.get(alternative)
                if found:
                    todo.append(found[0])
                    break
    return seen


def owned_files(names):
    """Every file the packages installed (dpkg's lists)."""
    files = set()
    info = "/var/lib/dpkg/info"
    lists = {}
    for entry in os.listdir(info):
        if entry.endswith(".list"):
            lists.setdefault(entry[:-5].split(":")[0], []).append(os.path.join(info, entry))
    for name in names:
        for path in lists.get(name, []):
            with open(path) as f:
                files.update(line.rstrip("\n") for line in f)
    return files


def prepare(source_dir, tmp):
    """Writes the fresh machine's files to `tmp`; returns the environment to run commands in
    and the set of its files."""
    wanted = subprocess.run([os.path.join(source_dir, "scripts", "setup.sh"), "--list-packages"],
                            stdout=subprocess.PIPE, text=True, check=True).stdout.split()
    files = owned_files(closure(wanted))
    listing = os.path.join(tmp, "fresh-machine-files")
    with open(listing, "w") as f:
        f.write("\n".join(sorted(files)))
    env = dict(os.environ)
    env["PYTHONPATH"] = SITECUSTOMIZE + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TRIDENT_FRESH_MACHINE_FILES"] = listing
    return env, files


def program_of(command, cwd):
    """The file a command line runs first (after VAR=value words): a script's interpreter
    too. [(path)] of those that exist."""
    words = [w for w in command.split() if not re.match(r"^[A-Z_]+=", w)]
    if not words:
        return []
    first = words[0]
    path = os.path.join(cwd, first) if "/" in first else shutil.which(first)
    if not path or not os.path.isfile(path):
        return []  # a shell builtin (export, cd)
    programs = [os.path.realpath(path)]
    with open(path, "rb") as f:
        head = f.readline()
    if head.startswith(b"#!"):
        interpreter = head[2:].decode().split()
        if os.path.basename(interpreter[0]) == "env" and len(interpreter) > 1:
            interpreter = [shutil.which(interpreter[1]) or interpreter[1]]
        programs.append(os.path.realpath(interpreter[0]))
    return programs


def missing_programs(command, cwd, files):
    """The Debian files a command runs that the fresh machine lacks (a program of a package
    run.sh did not install). Files of no package (the build's, the repository's) pass."""
    missing = []
    for program in program_of(command, cwd):
        owner = subprocess.run(["dpkg", "-S", program], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
        # /usr/bin/x may be listed as /bin/x (merged /usr), or the reverse.
        names = {program, program.replace("/usr/bin/", "/bin/", 1),
                 program.replace("/bin/", "/usr/bin/", 1)}
        if owner.returncode == 0 and not names & files:
            missing.append(f"{program} ({owner.stdout.split(':')[0]})")
    return missing
