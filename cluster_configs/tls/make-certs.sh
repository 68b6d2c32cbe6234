#!/usr/bin/env bash
# TLS between Ray processes: a cluster CA, and a certificate for one node signed by it.
#
#   cluster_configs/tls/make-certs.sh ca   DIR                  # once: DIR/ca.crt, DIR/ca.key (keep ca.key secret)
#   cluster_configs/tls/make-certs.sh node DIR NAME IP [IP...]  # per node: DIR/NAME.crt, DIR/NAME.key
#
# Every Ray process then starts with (docs/security.md):
#   export RAY_USE_TLS=1 RAY_TLS_CA_CERT=DIR/ca.crt RAY_TLS_SERVER_CERT=DIR/NAME.crt RAY_TLS_SERVER_KEY=DIR/NAME.key
# Ray uses the same certificate as server and client, so a node's certificate must name every
# address other processes reach it by (its IPs, and 127.0.0.1 for local connections). Ray connects
# even to a local GCS at the node IP it detects (`ray start` prints it as "Local node IP"): a certificate
# without that IP makes `ray start` hang at "Failed to connect to GCS", with "No match found for server
# name: <IP>" in the session's logs/gcs_server.err.
set -euo pipefail
usage() { sed -n '2,6p' "$0" >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd=$1 dir=$2
mkdir -p "$dir"
umask 077
case "$cmd" in
  ca)
    openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj "/CN=rayrl cluster CA" \
      -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
    chmod 644 "$dir/ca.crt"
    echo "wrote $dir/ca.crt and $dir/ca.key"
    ;;
  node)
    [ $# -ge 4 ] || usage
    name=$3; shift 3
    for f in ca.crt ca.key; do [ -f "$dir/$f" ] || { echo "make-certs.sh: $dir/$f missing; run '$0 ca $dir' first" >&2; exit 2; }; done
    san="DNS:localhost,DNS:$name"
    for ip in "$@"; do san="$san,IP:$ip"; done
    openssl req -newkey rsa:2048 -nodes -subj "/CN=$name" -keyout "$dir/$name.key" -out "$dir/$name.csr" 2>/dev/null
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" > "$dir/$name.ext"
    openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial -days 365 \
      -extfile "$dir/$name.ext" -out "$dir/$name.crt" 2>/dev/null
    rm -f "$dir/$name.csr" "$dir/$name.ext"
    chmod 644 "$dir/$name.crt"
    echo "wrote $dir/$name.crt and $dir/$name.key ($san)"
    ;;
  *) usage ;;
esac
