#!/usr/bin/env bash
# orion-ctl against a real orion-server whose admin API speaks TLS and requires client
# certificates (a CA, a server certificate for 127.0.0.1 and client certificates made here with
# openssl): a plaintext client and a client without a certificate are refused by the handshake, a
# certificate of another CA is refused, a certificate named as a reader in the tokens file reads
# but cannot change the policy, one named as an operator can (the audit line names it), a
# certificate whose name is in no tokens line must bring a token, and tokens still work over TLS.
#   orion_ctl_tls_test.sh ORION_SERVER ORION_CTL
set -euo pipefail
SERVER="$1"; CTL="$2"
W="$(mktemp -d /tmp/orion-ctl-tls.XXXXXX)"
trap 'kill "${PID:-0}" 2>/dev/null; wait "${PID:-0}" 2>/dev/null; rm -rf "$W"' EXIT
cd "$W"
ssl() { openssl "$@" 2>/dev/null; }
# Two CAs: ours, and another one nobody configured.
for ca in ca other; do
  ssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=orion test $ca" \
    -keyout "$ca.key" -out "$ca.crt"
done
# name, CA, extensions
cert() {
  ssl req -newkey rsa:2048 -nodes -subj "/CN=$1" -keyout "$1.key" -out "$1.csr"
  ssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" -CAcreateserial -days 2 \
    -extfile <(printf '%s\n' "$3") -out "$1.crt"
}
cert server ca "subjectAltName=IP:127.0.0.1,DNS:localhost"
for who in alice grafana mallory; do cert "$who" ca "extendedKeyUsage=clientAuth"; done
cert eve other "extendedKeyUsage=clientAuth"
printf 'operator alice op-0123456789abcdef0123\nreader grafana rd-0123456789abcdef0123\n' > tokens
grep reader tokens > reader.token
printf 'socket_path: %s/orion.sock\nadmin_address: 127.0.0.1:0\nmetrics_address: 127.0.0.1:0\nadmin_auth: {tokens_file: %s/tokens, tls_cert_file: %s/server.crt, tls_key_file: %s/server.key, client_ca_file: %s/ca.crt}\ngpus: [GPU-00000000-1111-2222-3333-444444444444]\n' \
  "$W" "$W" "$W" "$W" "$W" > s.yaml
# A key file that is no PEM is refused at start, naming the key and the file.
sed "s|tls_key_file: $W/server.key|tls_key_file: $W/tokens|" s.yaml > bad.yaml
if "$SERVER" --config bad.yaml > bad.log 2>&1; then echo "FAIL: started with a bad key"; exit 1; fi
grep -q "admin_auth.tls_key_file: $W/tokens is not a readable PEM file" bad.log ||
  { echo "FAIL: no clear error: $(cat bad.log)"; exit 1; }
"$SERVER" --config s.yaml > server.log 2>&1 &
PID=$!
port=""
for _ in $(seq 600); do
  port="$(sed -n 's/.*(port \([0-9]*\); gRPC health.*/\1/p' server.log)"
  [[ -n "$port" ]] && break
  sleep 0.05
done
[[ -n "$port" ]] || { cat server.log; echo "no admin port"; exit 1; }
ctl() { timeout 10 "$CTL" --server "127.0.0.1:$port" "$@"; }
as() { local who="$1"; shift; ctl --cacert ca.crt --cert "$who.crt" --key "$who.key" "$@"; }
fail() { echo "FAIL: $*"; cat server.log; exit 1; }

out="$(ctl health 2>&1)" && fail "a plaintext client was answered: $out"
out="$(ctl --cacert ca.crt health 2>&1)" && fail "a client without a certificate was answered: $out"
out="$(ctl --cacert ca.crt --cert eve.crt --key eve.key health 2>&1)" && fail "another CA's certificate was accepted: $out"
out="$(as grafana health)" || fail "reader certificate, health: $out"
grep -q "^SERVING: 1 GPU(s), 0 client(s)$" <<< "$out" || fail "health said: $out"
out="$(as grafana policy be_budget_us=321 2>&1)" && fail "a reader certificate changed the policy"
grep -q "grafana holds a reader certificate" <<< "$out" || fail "no clear denial: $out"
as alice policy be_budget_us=321 > /dev/null || fail "the operator certificate could not set the policy"
as grafana --json policy | grep -q '"be_budget_us": "321"' || fail "the budget did not change"
grep -q "audit: SetPolicy by alice (operator)" server.log || fail "no audit line naming alice"
out="$(as mallory gpus 2>&1)" && fail "a certificate named in no tokens line was let in without a token"
grep -q "'mallory' is not a NAME" <<< "$out" || fail "no clear refusal of mallory: $out"
as mallory --token-file reader.token gpus > /dev/null || fail "a token over TLS was refused"
out="$(as mallory --token-file reader.token policy be_budget_us=1 2>&1)" && fail "mallory with a reader token changed the policy"
grep -q "holds a reader token" <<< "$out" || fail "no clear denial: $out"
echo "orion-ctl TLS: ok"
