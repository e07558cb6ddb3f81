#!/usr/bin/env bash
# From zero to a secured 3-broker cluster on this host, with the project's commands only:
# CURVE on every port, HS256 tokens, roles and bindings, and a refused request of each
# kind. docs/security.md "Worked example" walks through it; a test runs it
# (tests/integration/security/test_security_cluster.py), so every command here works as written.
#
#     bash examples/secured_cluster.sh [DIR]        # DIR default ./danube-secure
#
# Ports: CLIENT_PORT (6650), ADMIN_PORT (50051), RAFT_PORT (7650), METRICS_PORT (9040) for
# the first broker, the next two count up; SUPERVISOR_PORT (1900). The cluster is stopped
# at the end.
set -euo pipefail

DIR=${1:-./danube-secure}
CLIENT_PORT=${CLIENT_PORT:-6650}
ADMIN_PORT=${ADMIN_PORT:-50051}
RAFT_PORT=${RAFT_PORT:-7650}
METRICS_PORT=${METRICS_PORT:-9040}
SUPERVISOR_PORT=${SUPERVISOR_PORT:-1900}
# The project's CLI: $DANUBE if set, else the venv beside this script's repo (`./run`
# and the README make .venv), else `danube` on PATH, else the module under python3.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z ${DANUBE:-} ]]; then
    if [[ -x $ROOT/.venv/bin/danube ]]; then DANUBE=$ROOT/.venv/bin/danube
    elif command -v danube >/dev/null; then DANUBE=danube
    elif python3 -c 'import danube_zmq' 2>/dev/null; then DANUBE="python3 -m danube_zmq.cli.main"
    else
        echo "no danube CLI: not in $ROOT/.venv (./run demo makes it), on PATH or for python3; or set DANUBE" >&2
        exit 1
    fi
fi
# Start from a clean shell: no key or token left over from another cluster.
unset DANUBE_SERVER_KEY DANUBE_CLIENT_KEYS DANUBE_TOKEN DANUBE_TOKEN_FILE DANUBE_ADMIN_ENDPOINT DANUBE_SERVICE_URL

step() { printf '\n== %s\n' "$*"; }
refused() {  # run a command that must fail, and show why it did
    if out=$("$@" 2>&1); then echo "UNEXPECTED: allowed: $*"; exit 1; fi
    echo "refused as expected: $(echo "$out" | tail -n 1)"
}

step "1. Start three brokers in security.mode curve (keys, JWT secret, admin token made in $DIR/security)"
$DANUBE cluster up --brokers 3 --data-dir "$DIR" --security-dir "$DIR/security" \
    --client-port "$CLIENT_PORT" --admin-port "$ADMIN_PORT" --raft-port "$RAFT_PORT" \
    --metrics-port "$METRICS_PORT" --supervisor-port "$SUPERVISOR_PORT"
trap '$DANUBE cluster down --data-dir "$DIR" >/dev/null 2>&1 || true' EXIT
ls -l "$DIR/security" "$DIR/security/broker-keys"

step "2. The operator's shell: the cluster's public key and the admin token"
export DANUBE_SERVER_KEY=$DIR/security/broker-keys/cluster.key
export DANUBE_TOKEN_FILE=$DIR/security/admin.jwt
export DANUBE_ADMIN_ENDPOINT=tcp://127.0.0.1:$ADMIN_PORT
$DANUBE admin brokers list

step "3. Roles, and who gets them where"
$DANUBE security roles create producer --permission Lookup --permission Produce
$DANUBE security roles create consumer --permission Lookup --permission Consume
$DANUBE security bindings create --principal ingest --type service_account --role producer \
    --scope topic:/default/orders
$DANUBE security bindings create --principal audit --type service_account --role consumer \
    --scope namespace:default
$DANUBE security bindings list

step "4. A token per application (minted offline with the secret; 1 hour)"
$DANUBE security tokens create --subject ingest --type service_account --ttl 1h \
    --secret-file "$DIR/security/jwt.secret" > "$DIR/ingest.jwt"
$DANUBE security tokens create --subject audit --type service_account --ttl 1h \
    --secret-file "$DIR/security/jwt.secret" > "$DIR/audit.jwt"
$DANUBE security tokens validate "$(cat "$DIR/ingest.jwt")" --secret-file "$DIR/security/jwt.secret"

step "5. The admin creates a reliable topic; ingest produces, audit consumes"
$DANUBE admin topics create /default/orders --dispatch-strategy reliable
$DANUBE produce -s "tcp://127.0.0.1:$CLIENT_PORT" -t /default/orders --reliable -m "order" -c 5 \
    --token-file "$DIR/ingest.jwt"
$DANUBE consume -s "tcp://127.0.0.1:$((CLIENT_PORT + 1))" -t /default/orders -m audit \
    --initial-position earliest -c 5 --timeout 30 --token-file "$DIR/audit.jwt"

step "6. What is refused"
refused $DANUBE consume -s "tcp://127.0.0.1:$CLIENT_PORT" -t /default/orders -m sneak -c 1 --timeout 10 \
    --token-file "$DIR/ingest.jwt"                              # ingest may not consume
refused $DANUBE produce -s "tcp://127.0.0.1:$CLIENT_PORT" -t /default/other -m x \
    --token-file "$DIR/ingest.jwt"                              # nor produce elsewhere
refused $DANUBE admin --token-file "$DIR/audit.jwt" topics delete /default/orders   # audit is no admin
refused env DANUBE_TOKEN_FILE= $DANUBE admin topics list default                    # no token: nobody
refused env DANUBE_SERVER_KEY= $DANUBE admin brokers list                           # plaintext: no handshake

step "7. Revoke a token by its jti: its next request is refused"
read -r JTI EXP < <($DANUBE security tokens validate - --secret-file "$DIR/security/jwt.secret" --json \
    < "$DIR/audit.jwt" | python3 -c 'import json, sys; c = json.load(sys.stdin); print(c["jti"], c["exp"])')
$DANUBE security revocations add "$JTI" --expires-at "$EXP"
refused $DANUBE consume -s "tcp://127.0.0.1:$CLIENT_PORT" -t /default/orders -m audit -c 1 --timeout 10 \
    --token-file "$DIR/audit.jwt"

step "8. Status, then stop"
$DANUBE cluster status --data-dir "$DIR"
trap - EXIT
$DANUBE cluster down --data-dir "$DIR"
echo "secured cluster example: done"
