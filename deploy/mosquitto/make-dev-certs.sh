#!/usr/bin/env bash
# Make a development CA and a Mosquitto server certificate signed by it (ECDSA P-256, openssl).
#
#   deploy/mosquitto/make-dev-certs.sh [OUT_DIR] [NAME ...]
#
# OUT_DIR defaults to deploy/mosquitto/certs. Each NAME (a DNS name or an IP address) is added to
# the server certificate's subjectAltName, after localhost, 127.0.0.1 and ::1; clients verify the
# host name they connect to against this list, so add the broker's LAN name or address, e.g.
#   deploy/mosquitto/make-dev-certs.sh deploy/mosquitto/certs broker.lab.local 192.168.1.20
#
# Writes ca.crt (give it to clients: broker.ca_file), ca.key, server.crt and server.key (for the
# broker's cafile/certfile/keyfile). An existing CA in OUT_DIR is reused, so clients that already
# trust it keep working; the server certificate is always reissued.
#
# For development and tests only: the CA key sits unencrypted next to the certificates. In
# production use your organisation's CA or an ACME certificate.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/certs}"
[ $# -gt 0 ] && shift
command -v openssl >/dev/null || { echo "make-dev-certs.sh: openssl not found; install it" >&2; exit 1; }

umask 077
mkdir -p "$out"
cd "$out"

san="DNS:localhost,IP:127.0.0.1,IP:::1"
for name in "$@"; do
    if [[ "$name" =~ ^[0-9.]+$ || "$name" == *:* ]]; then
        san="$san,IP:$name"
    else
        san="$san,DNS:$name"
    fi
done

if [ ! -s ca.key ] || [ ! -s ca.crt ]; then
    openssl ecparam -name prime256v1 -genkey -noout -out ca.key
    openssl req -x509 -new -sha256 -days 3650 -key ca.key -out ca.crt \
        -subj "/O=gazeguard development/CN=gazeguard dev CA" \
        -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -addext "subjectKeyIdentifier=hash"
fi

openssl ecparam -name prime256v1 -genkey -noout -out server.key
openssl req -new -sha256 -key server.key -out server.csr \
    -subj "/O=gazeguard development/CN=${1:-localhost}"
cat >server.ext <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=$san
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
EOF
openssl x509 -req -sha256 -days 397 -in server.csr -CA ca.crt -CAkey ca.key \
    -CAcreateserial -extfile server.ext -out server.crt
rm -f server.csr server.ext ca.srl

chmod 0644 ca.crt server.crt
chmod 0600 ca.key
chmod 0640 server.key
openssl verify -CAfile ca.crt server.crt >/dev/null
echo "make-dev-certs.sh: wrote $out/{ca.crt,ca.key,server.crt,server.key}; subjectAltName $san"
