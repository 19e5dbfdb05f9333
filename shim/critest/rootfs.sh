#!/usr/bin/env bash
# The root trees of critest's stand-in images, one directory per layer, for
# `cargo xtask critest` (xtask/src/critest/images.rs packs them into OCI images).
#
#   rootfs.sh OUT BUSYBOX_DEB NGINX_DEB
#
# Nothing upstream can be pulled here, so the images critest names are rebuilt from Debian's
# packages (the two .debs, fetched with `apt-get download`, and the host's libraries):
#
#   busybox         Debian's *dynamic* busybox, every applet a hard link to it (the static
#                   build's shell runs applets in-process, so a masked /bin/ls would not
#                   bite even with runc), its libraries, util-linux's ipcs and a pgrep
#                   (Debian's busybox has neither), /etc/passwd and /etc/group as busybox's
#   nginx           Debian's nginx and its libraries, `daemon off`, port 80, pid file
#                   /var/run/nginx.pid (on top of busybox)
#   hostnet-nginx   the same listening on 12003 (on top of nginx)
#   predefined-group  default-user (uid 1000) in group-defined-in-image (gid 50000)
#   nonewprivs      a static setuid-root program printing its effective uid
#   pause           a static program that waits for SIGINT/SIGTERM and reaps children
set -euo pipefail

if [ $# -ne 3 ]; then
    echo "usage: $0 OUT BUSYBOX_DEB NGINX_DEB" >&2
    exit 2
fi
out=$1
busybox_deb=$2
nginx_deb=$3
here=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

rm -rf "$out"
mkdir -p "$out"

# Copies the shared libraries ELF file $1 needs (as `ldd` resolves them on this host) into
# root $2, each at the path ldd names, symlinks resolved.
copy_libs() {
    local lib
    for lib in $(ldd "$1" | grep -o '/[^ ]*'); do
        mkdir -p "$2$(dirname "$lib")"
        cp -L "$lib" "$2$lib"
    done
}

# --- busybox ---
bb=$out/busybox
dpkg-deb -x "$busybox_deb" "$scratch/busybox"
mkdir -p "$bb/bin" "$bb/sbin" "$bb/usr/bin" "$bb/usr/sbin" "$bb/etc" "$bb/root" \
    "$bb/tmp" "$bb/var/run" "$bb/proc" "$bb/sys" "$bb/dev"
chmod 1777 "$bb/tmp"
cp "$scratch/busybox/bin/busybox" "$bb/bin/busybox"
copy_libs "$bb/bin/busybox" "$bb"
for applet in $("$bb/bin/busybox" --list-full); do
    [ -e "$bb/$applet" ] || ln "$bb/bin/busybox" "$bb/$applet"
done
# Debian's busybox lacks ipcs (the HostIpc specs) and pgrep (the execSync timeout spec).
cp /usr/bin/ipcs "$bb/usr/bin/ipcs"
copy_libs /usr/bin/ipcs "$bb"
cat >"$bb/usr/bin/pgrep" <<'EOF'
#!/bin/sh
# pgrep NAME: the pids of the processes called NAME, one a line.
pidof "$1" | tr ' ' '\n' | grep .
EOF
chmod 755 "$bb/usr/bin/pgrep"
cat >"$bb/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
EOF
cat >"$bb/etc/group" <<'EOF'
root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
disk:x:6:
wheel:x:10:root
mail:x:12:
www-data:x:33:
operator:x:37:
users:x:100:
nogroup:x:65534:
EOF

# --- nginx (on top of busybox) ---
ng=$out/nginx
dpkg-deb -x "$nginx_deb" "$scratch/nginx"
mkdir -p "$ng/usr/sbin" "$ng/etc/nginx" "$ng/var/log/nginx" "$ng/var/lib/nginx" \
    "$ng/usr/share/nginx/html"
cp "$scratch/nginx/usr/sbin/nginx" "$ng/usr/sbin/nginx"
copy_libs "$ng/usr/sbin/nginx" "$ng"
# The libraries busybox's layer already has would only be copied twice.
(cd "$bb" && find . -type f -path './lib*' -print) | while read -r lib; do
    rm -f "$ng/$lib"
done
nginx_conf() {
    cat <<EOF
user www-data www-data;
worker_processes 1;
pid /var/run/nginx.pid;
error_log stderr;
events { worker_connections 64; }
http {
    access_log /dev/stdout;
    default_type text/html;
    server {
        listen $1;
        root /usr/share/nginx/html;
        index index.html;
    }
}
EOF
}
nginx_conf 80 >"$ng/etc/nginx/nginx.conf"
echo '<html><body><h1>Welcome to nginx!</h1></body></html>' >"$ng/usr/share/nginx/html/index.html"

# --- hostnet-nginx (on top of nginx) ---
mkdir -p "$out/hostnet-nginx/etc/nginx"
nginx_conf 12003 >"$out/hostnet-nginx/etc/nginx/nginx.conf"

# --- predefined-group (on top of busybox): `adduser -u 1000 -D default-user`, then
# `addgroup -g 50000 group-defined-in-image` and `addgroup default-user group-defined-in-image`
pg=$out/predefined-group
mkdir -p "$pg/etc" "$pg/home/default-user"
chown 1000:1000 "$pg/home/default-user"
{ cat "$bb/etc/passwd"; echo 'default-user:x:1000:1000:Linux User,,,:/home/default-user:/bin/sh'; } \
    >"$pg/etc/passwd"
{ cat "$bb/etc/group"; echo 'default-user:x:1000:'; echo 'group-defined-in-image:x:50000:default-user'; } \
    >"$pg/etc/group"

# --- nonewprivs (on top of busybox, as upstream's is on alpine) and pause (alone): static ---
mkdir -p "$out/nonewprivs/usr/local/bin" "$out/pause"
gcc -static -O2 -s -o "$out/nonewprivs/usr/local/bin/nonewprivs" "$here/nonewprivs.c"
chmod 4755 "$out/nonewprivs/usr/local/bin/nonewprivs"
gcc -static -O2 -s -o "$out/pause/pause" "$here/pause.c"
