# shellcheck shell=bash
# shellcheck disable=SC2154  # dir, bin, pidfile, apiserver_port, node_images: set by scripts/local-cluster
# The real node of `scripts/local-cluster start --node` (sourced by scripts/local-cluster):
# containerd (Debian's containerd 1.6 with runc), the CNI bridge and host-local plugins
# (containernetworking-plugins), and a kubelet and kube-scheduler built from the same Go module as
# the control plane (scripts/build-control-plane --node). See docs/real-node.md.
#
# What it changes on the host, all recorded in a journal before it is changed and put back by
# node_restore (run by the supervisor when the cluster stops, by `stop`, and by the next start if a
# node was killed before it could clean up):
#   - a bridge, agentrun0, holding the node's address (10.213.0.1/24 by default,
#     AGENTRUN_NODE_CIDR), with route_localnet on it; Pods get addresses of that /24 and a default
#     route through the node's address. IP forwarding stays off, so nothing a Pod sends leaves the
#     machine: Pods reach the node's own addresses and each other, nothing else;
#   - two iptables (nft) rules: DNAT of the kubernetes Service (10.96.0.1:443) from the bridge to
#     the API server on 127.0.0.1, and an ACCEPT of exactly that traffic ahead of the kubelet's
#     KUBE-FIREWALL (which drops DNATed traffic to loopback); and the chains the kubelet makes
#     (KUBE-FIREWALL, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT). Tables that did not exist before are
#     deleted again, in the others the rules and chains that were not there;
#   - the sysctls the kubelet sets (kernel.panic, kernel.panic_on_oops, vm.overcommit_memory, ...);
#   - the kubelet's cgroups (kubepods in every cgroup hierarchy);
#   - mounts (Pod volumes, container root filesystems, network namespaces) and the folders
#     containerd and the kubelet make outside the cluster folder (/run/containerd, /run/netns,
#     /var/lib/cni, /var/log/containers), and the processes (containerd, its shims, the containers,
#     kubelet, kube-scheduler).
# `scripts/local-cluster host-state` prints all of that; the node writes it to host-state.before
# (before it changes anything) and host-state.after (once restored) in $node_cache, and logs any
# difference.

node_name=agentrun-node
node_bridge=agentrun0
node_cidr=${AGENTRUN_NODE_CIDR:-10.213.0.0/24}
node_prefix=${node_cidr%.*/*}           # 10.213.0
node_ip="$node_prefix.1"
node_service_ip=10.96.0.1
node_cache="${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}/node"
node_journal="$node_cache/journal"
# The sysctls the kubelet sets (setupKernelTunables) and the ones a bridge could touch.
node_sysctls=(kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward
  net.ipv4.conf.all.route_localnet net.ipv4.conf.all.forwarding net.ipv6.conf.all.forwarding
  net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables)
# Folders outside the cluster folder that containerd, its shims, CNI and the kubelet may create.
node_host_paths=(/run/containerd /run/netns /var/lib/cni /var/log/containers /var/log/pods
  /var/lib/kubelet /var/lib/containerd /opt/containerd /etc/cni /opt/cni /etc/kubernetes)
# Debian packages of the node, by the file that shows each is installed.
node_packages=(
  "/usr/bin/containerd containerd"
  "/usr/sbin/runc runc"
  "/usr/lib/cni/bridge containernetworking-plugins"
  "/usr/sbin/iptables iptables"
  "/usr/sbin/nft nftables"
  "/usr/bin/umoci umoci"
  "/usr/bin/flock util-linux"
  "/usr/sbin/ip iproute2"
)

node_missing_packages() {
  local entry file pkg missing=()
  for entry in "${node_packages[@]}"; do
    read -r file pkg <<<"$entry"
    [ -e "$file" ] || missing+=("$pkg")
  done
  echo "${missing[*]}"
}

install_node_packages() {
  local missing
  missing=$(node_missing_packages)
  if [ -z "$missing" ]; then log "node packages: all installed"; return; fi
  log "installing $missing (apt-get)"
  apt-get update -qq >/dev/null
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
}

# Everything the node needs, or a failure naming what is missing.
node_preflight() {
  local problems=()
  [ "$(id -u)" = 0 ] || problems+=("root (the node runs containerd and a kubelet)")
  local missing
  missing=$(node_missing_packages)
  [ -z "$missing" ] || problems+=("Debian packages: $missing (scripts/local-cluster install-node-packages)")
  for b in kubelet kube-scheduler; do
    [ -x "$bin/$b" ] || problems+=("$bin/$b (scripts/build-control-plane --node)")
  done
  [ -n "$(node_pause_archive)" ] || problems+=("the pause image in $bin (scripts/build-control-plane --node)")
  local image
  for image in "${node_images[@]}"; do
    [ -f "$image" ] || problems+=("the image archive $image (scripts/image)")
  done
  grep -q ' /sys/fs/cgroup/memory cgroup ' /proc/mounts || grep -q ' /sys/fs/cgroup cgroup2 ' /proc/mounts ||
    problems+=("a mounted memory cgroup")
  local used
  used=$(ip -o route show table all to match "$node_ip" 2>/dev/null | grep -v '^default' || true)
  [ -z "$used" ] || problems+=("a free network for the node: $node_cidr is in use ($used); set AGENTRUN_NODE_CIDR")
  if [ ${#problems[@]} -gt 0 ]; then
    log "the node cannot start; missing:"
    local p
    for p in "${problems[@]}"; do log "  - $p"; done
    exit 1
  fi
}

node_pause_archive() {
  local f
  for f in "$bin"/pause-*.oci.tar; do [ -f "$f" ] && { echo "$f"; return; }; done
}

# ---------------------------------------------------------------------------------------------
# The host journal: what the host looked like before the node changed it.

node_lock() {
  mkdir -p "$node_cache"
  exec 9>"$node_cache/lock"
  if ! flock -n 9; then
    log "another node is running ($(cat "$node_cache/owner" 2>/dev/null || echo unknown)); waiting up to 15 minutes"
    flock -w 900 9 || { log "another node still runs: stop it with scripts/local-cluster stop --dir DIR"; exit 1; }
  fi
  echo "cluster $dir, supervisor pid $$" >"$node_cache/owner"
}

node_journal_begin() {
  rm -rf "$node_journal.tmp"
  mkdir -p "$node_journal.tmp"
  # The host as it is before the node (compared with host-state.after when the node stopped).
  { echo "# cluster $dir"; host_state; } >"$node_cache/host-state.before"
  rm -f "$node_cache/host-state.after"
  local s v
  for s in "${node_sysctls[@]}"; do
    v=$(sysctl -n "$s" 2>/dev/null) && printf '%s %s\n' "$s" "$v" >>"$node_journal.tmp/sysctls"
  done
  touch "$node_journal.tmp/sysctls"
  local p
  for p in "${node_host_paths[@]}"; do [ -e "$p" ] || echo "$p" >>"$node_journal.tmp/created-paths"; done
  touch "$node_journal.tmp/created-paths"
  nft list tables 2>/dev/null | sort >"$node_journal.tmp/nft-tables"
  for family in ip ip6; do
    local save=iptables-save
    [ "$family" = ip6 ] && save=ip6tables-save
    $save 2>/dev/null | awk -v f="$family" '/^\*/{t=substr($1,2)} /^:/{print f, t, substr($1,2)}' \
      >>"$node_journal.tmp/chains"
  done
  touch "$node_journal.tmp/chains"
  local h
  for h in /sys/fs/cgroup/*/; do
    [ -d "$h/kubepods" ] && echo "$h/kubepods" >>"$node_journal.tmp/cgroups"
  done
  touch "$node_journal.tmp/cgroups"
  ls /run/netns 2>/dev/null >"$node_journal.tmp/netns" || true
  awk '{print $5}' /proc/self/mountinfo | sort >"$node_journal.tmp/mounts"
  ip -o link show type bridge 2>/dev/null | grep -q ": $node_bridge:" && echo "$node_bridge" >"$node_journal.tmp/bridge-existed"
  echo "$dir" >"$node_journal.tmp/cluster"
  rm -rf "$node_journal"
  mv "$node_journal.tmp" "$node_journal"
}

# Put back everything the journal recorded. Idempotent; safe when nothing of the node runs.
node_restore() {
  [ -d "$node_journal" ] || return 0
  # Best effort, every step: one thing that is already gone must not stop the others.
  local -
  set +e +o pipefail
  local jdir
  jdir=$(cat "$node_journal/cluster" 2>/dev/null || echo "$dir")
  local node_dir="$jdir/node"
  local sock="$node_dir/containerd/containerd.sock"

  # Processes: containerd's shims for our socket, then whatever still runs in the node's cgroups.
  local pid shims
  shims=$(pgrep -f "containerd-shim-runc-v2 .*-address $sock" 2>/dev/null)
  for pid in $shims; do kill -KILL "$pid" 2>/dev/null || true; done
  for _ in $(seq 1 50); do
    local left=false
    for pid in $shims; do
      # Gone, or a zombie waiting for its parent: either way no longer running.
      [ -r "/proc/$pid/stat" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] && left=true
    done
    $left || break
    sleep 0.1
  done
  local h f
  for _ in 1 2 3; do
    local any=false
    for h in /sys/fs/cgroup/*/kubepods; do
      [ -d "$h" ] || continue
      grep -qx "$h" "$node_journal/cgroups" 2>/dev/null && continue
      while IFS= read -r f; do
        while read -r pid; do kill -KILL "$pid" 2>/dev/null && any=true; done <"$f"
      done < <(find "$h" -name cgroup.procs 2>/dev/null)
    done
    $any || break
    sleep 0.5
  done

  # Mounts made since the node started (deepest first), then the network namespaces.
  local m
  while read -r m; do
    case "$m" in
      "$node_dir"/*|/run/netns/*|/run/containerd/*|/var/lib/kubelet/*) umount -l "$m" 2>/dev/null || true ;;
    esac
  done < <(awk '{print $5}' /proc/self/mountinfo | sort | comm -13 "$node_journal/mounts" - | sort -r)
  local path ns
  for path in /run/netns/*; do
    [ -e "$path" ] || continue
    ns=${path##*/}
    grep -qx "$ns" "$node_journal/netns" 2>/dev/null || ip netns delete "$ns" 2>/dev/null || rm -f "$path"
  done

  # cgroups the kubelet and runc made (the hierarchies' own kubepods folders, deepest first).
  for h in /sys/fs/cgroup/*/kubepods; do
    [ -d "$h" ] || continue
    grep -qx "$h" "$node_journal/cgroups" 2>/dev/null && continue
    find "$h" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    [ -d "$h" ] && log "could not remove the cgroup $h"
  done

  # The bridge and the veths on it.
  if [ ! -f "$node_journal/bridge-existed" ]; then
    local l
    for l in $(ip -o link show master "$node_bridge" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
      ip link delete "$l" 2>/dev/null || true
    done
    ip link delete "$node_bridge" 2>/dev/null || true
  fi

  # iptables: tables that did not exist are deleted whole; in the others, our rule and the chains
  # that were not there.
  local family table chain
  while read -r _ family table; do
    grep -qx "table $family $table" "$node_journal/nft-tables" || nft delete table "$family" "$table" 2>/dev/null || true
  done < <(nft list tables 2>/dev/null)
  local spec
  for spec in "nat PREROUTING" "filter INPUT"; do
    read -r table chain <<<"$spec"
    iptables -t "$table" -S "$chain" 2>/dev/null | grep -- '--comment agentrun-node' | sed 's/^-A /-D /' |
      while read -r rule; do eval "iptables -t $table $rule" 2>/dev/null || true; done
  done
  for family in ip ip6; do
    local cmd=iptables save=iptables-save
    [ "$family" = ip6 ] && { cmd=ip6tables; save=ip6tables-save; }
    local new_chains
    new_chains=$($save 2>/dev/null | awk '/^\*/{t=substr($1,2)} /^:/{print t, substr($1,2)}' |
      while read -r table chain; do
        case "$chain" in PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING) continue ;; esac
        grep -qx "$family $table $chain" "$node_journal/chains" || echo "$table $chain"
      done)
    [ -n "$new_chains" ] || continue
    # First the jumps into them (from any chain), then the chains themselves.
    while read -r table chain; do
      $cmd -t "$table" -S 2>/dev/null | grep -E -- "-j $chain( |\$)" | sed 's/^-A /-D /' |
        while read -r rule; do eval "$cmd -t $table $rule" 2>/dev/null || true; done
    done <<<"$new_chains"
    while read -r table chain; do
      $cmd -t "$table" -F "$chain" 2>/dev/null || true
      $cmd -t "$table" -X "$chain" 2>/dev/null || true
    done <<<"$new_chains"
  done

  # sysctls, as they were.
  local s v cur
  while read -r s v; do
    cur=$(sysctl -n "$s" 2>/dev/null) || continue
    [ "$cur" = "$v" ] || sysctl -q -w "$s=$v" >/dev/null 2>&1 || log "could not restore $s=$v (now $cur)"
  done <"$node_journal/sysctls"

  # Folders the node created outside its cluster folder (deepest first; /run/containerd may hold
  # the shims' socket folder).
  local p
  while read -r p; do
    [ -n "$p" ] && [ -e "$p" ] && rm -rf --one-file-system "$p"
  done < <(sort -r "$node_journal/created-paths")

  rm -rf "$node_journal"
  { echo "# cluster $jdir"; host_state; } >"$node_cache/host-state.after"
  if head -n 1 "$node_cache/host-state.before" 2>/dev/null | grep -qx "# cluster $jdir"; then
    if diff -u "$node_cache/host-state.before" "$node_cache/host-state.after" >&2; then
      log "node: host restored (host-state before and after are the same)"
    else
      log "node: the host differs from before the node (diff above)"
    fi
  else
    log "node: host restored"
  fi
}

# ---------------------------------------------------------------------------------------------
# Start and stop.

node_write_configs() {
  local node_dir=$1 sock=$2 pause_name=$3 kubelet_port=$4 healthz_port=$5
  mkdir -p "$node_dir/containerd" "$node_dir/cni/net.d" "$node_dir/kubelet" "$node_dir/pod-logs"
  cat >"$node_dir/containerd/config.toml" <<TOML
version = 2
root = "$node_dir/containerd/root"
state = "$node_dir/containerd/state"
oom_score = 0
# Only what the CRI plugin needs; the others would look for devices and folders of the host.
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$sock"

[ttrpc]
  address = ""

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$node_dir/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_name"
  # root here lacks CAP_SYS_RESOURCE: a negative oom_score_adj would fail every sandbox.
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$node_dir/cni/net.d"
    max_conf_num = 1
TOML
  cat >"$node_dir/cni/net.d/10-agentrun-node.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "agentrun-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$node_bridge",
      "isGateway": false,
      "ipMasq": false,
      "hairpinMode": false,
      "ipam": {
        "type": "host-local",
        "dataDir": "$node_dir/cni/ipam",
        "ranges": [[{"subnet": "$node_cidr", "rangeStart": "$node_prefix.10", "gateway": "$node_ip"}]],
        "routes": [{"dst": "0.0.0.0/0", "gw": "$node_ip"}]
      }
    }
  ]
}
JSON
  cat >"$node_dir/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $node_ip
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz_port
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $dir/pki/ca.crt}
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://$sock
# cgroups here are the v1/hybrid layout.
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
podLogsDir: $node_dir/pod-logs
clusterDomain: cluster.local
# No image can be pulled here: never collect the imported ones. Evict (and taint the node with
# disk-pressure) only when the disk is really full: in absolute terms, since a percentage of a large
# thin-provisioned disk can be more than what is free.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 100Mi, imagefs.available: 100Mi, nodefs.inodesFree: 1%}
serializeImagePulls: false
YAML
}

node_wait() { # seconds what command...
  local secs=$1 what=$2; shift 2
  local deadline=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then log "$what: not after ${secs}s"; return 1; fi
    sleep 0.2
  done
}

# Starts containerd, imports the images, starts kube-scheduler and the kubelet, waits until the
# node is Ready. Runs in the supervisor after the API server is ready.
node_start() {
  local t0 t
  t0=$(date +%s.%N)
  # node_down runs from the EXIT trap, where run_foreground's locals are gone.
  node_kubectl="$bin/kubectl"
  local node_dir="$dir/node"
  rm -rf "$node_dir"
  mkdir -p "$node_dir"
  local sock="$node_dir/containerd/containerd.sock"
  local pause_archive pause_name
  pause_archive=$(node_pause_archive)
  pause_name="localhost/agentrun/pause:$(basename "$pause_archive" .oci.tar | sed 's/^pause-//')"

  node_journal_begin
  node_started=true

  ip link add "$node_bridge" type bridge
  ip addr add "$node_ip/${node_cidr#*/}" dev "$node_bridge"
  ip link set "$node_bridge" up
  sysctl -q -w "net.ipv4.conf.$node_bridge.route_localnet=1" >/dev/null
  iptables -t nat -A PREROUTING -i "$node_bridge" -d "$node_service_ip/32" -p tcp --dport 443 \
    -m comment --comment agentrun-node -j DNAT --to-destination "127.0.0.1:$apiserver_port"

  local kubelet_port healthz_port scheduler_port
  kubelet_port=$(free_port); healthz_port=$(free_port); scheduler_port=$(free_port)
  node_write_configs "$node_dir" "$sock" "$pause_name" "$kubelet_port" "$healthz_port"

  log "starting containerd ($(containerd --version | awk '{print $3}'), runc $(runc --version | awk 'NR==1{print $3}'))"
  start_proc containerd /usr/bin/containerd --config "$node_dir/containerd/config.toml" --log-level warn
  node_wait 30 "containerd" ctr --address "$sock" version || { tail -n 30 "$dir/logs/containerd.log" >&2; exit 1; }
  t=$(date +%s.%N)
  local image
  for image in "$pause_archive" "${node_images[@]}"; do
    ctr --address "$sock" -n k8s.io images import --snapshotter overlayfs "$image" >/dev/null
  done
  log "imported $(ctr --address "$sock" -n k8s.io images ls -q | grep -v '^sha256:' | tr '\n' ' ')in $(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1fs", b-a}')"

  log "starting kube-scheduler"
  start_proc kube-scheduler "$bin/kube-scheduler" \
    --kubeconfig "$dir/kubeconfig/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig "$dir/kubeconfig/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig "$dir/kubeconfig/kube-scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$scheduler_port" --cert-dir "$node_dir/scheduler" \
    --leader-elect=false --v 1

  log "starting the kubelet ($node_name, $node_ip:$kubelet_port)"
  start_proc kubelet "$bin/kubelet" \
    --config "$node_dir/kubelet/config.yaml" \
    --kubeconfig "$dir/kubeconfig/kubelet.kubeconfig" \
    --root-dir "$node_dir/kubelet" --cert-dir "$node_dir/kubelet/pki" \
    --hostname-override "$node_name" --node-ip "$node_ip" --v 1

  local admin="$dir/kubeconfig/admin.kubeconfig"
  local ready='{.status.conditions[?(@.type=="Ready")].status}'
  local deadline=$(( $(date +%s) + 120 ))
  until [ "$("$bin/kubectl" --kubeconfig "$admin" get node "$node_name" -o jsonpath="$ready" 2>/dev/null)" = True ]; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      log "the node did not become Ready; last kubelet log lines:"; tail -n 40 "$dir/logs/kubelet.log" >&2; exit 1
    fi
    local name pid exe
    while read -r name pid exe; do
      if ! alive "$pid" "$exe"; then log "$name exited early; last log lines:"; tail -n 30 "$dir/logs/$name.log" >&2; exit 1; fi
    done <"$pidfile"
    sleep 0.2
  done
  # The kubelet's KUBE-FIREWALL chain drops DNATed traffic from outside loopback to loopback
  # (CVE-2020-8558): let through exactly the Pods' traffic to the API server, ahead of it.
  for _ in $(seq 1 100); do iptables -S INPUT 2>/dev/null | grep -q KUBE-FIREWALL && break; sleep 0.1; done
  iptables -I INPUT 1 -i "$node_bridge" -d 127.0.0.1/32 -p tcp --dport "$apiserver_port" \
    -m comment --comment agentrun-node -j ACCEPT
  node_seconds=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  cat >"$dir/node.env" <<ENV
NODE_NAME=$node_name
NODE_IP=$node_ip
NODE_CIDR=$node_cidr
CONTAINERD_ADDRESS=$sock
NODE_START_SECONDS=$node_seconds
ENV
  log "node $node_name Ready in ${node_seconds}s (containerd, images, kube-scheduler, kubelet)"
}

# Stops what runs on the node while the API server still answers: the scheduler first (so nothing
# new is placed), then every Pod of the node is deleted and the kubelet tears its sandboxes down
# (containers, network namespaces, IP addresses); then the kubelet and containerd stop.
node_down() {
  $node_started || return 0
  local -
  set +e +o pipefail
  local node_dir="$dir/node"
  local sock="$node_dir/containerd/containerd.sock"
  local admin="$dir/kubeconfig/admin.kubeconfig"
  stop_named kube-scheduler
  if [ -S "$sock" ]; then
    "$node_kubectl" --kubeconfig "$admin" delete pods --all-namespaces \
      --field-selector "spec.nodeName=$node_name" --grace-period=2 --wait=false >/dev/null 2>&1 || true
    local deadline=$(( $(date +%s) + 60 ))
    while [ -n "$(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null)" ]; do
      if [ "$(date +%s)" -ge "$deadline" ]; then log "node: containers still run after 60s; killing them"; break; fi
      sleep 0.3
    done
  fi
  stop_named kubelet
  stop_named containerd
  node_restore
  node_started=false
}

# Stops one recorded process (TERM, then KILL after 10s) and drops it from the record.
stop_named() {
  local want=$1 name pid exe
  [ -f "$pidfile" ] || return 0
  while read -r name pid exe; do
    [ "$name" = "$want" ] || continue
    if alive "$pid" "$exe"; then kill -TERM "$pid" 2>/dev/null || true; fi
    for _ in $(seq 1 100); do alive "$pid" "$exe" || break; sleep 0.1; done
    if alive "$pid" "$exe"; then kill -KILL "$pid" 2>/dev/null || true; fi
  done <"$pidfile"
  grep -v "^$want " "$pidfile" >"$pidfile.tmp" || true
  mv "$pidfile.tmp" "$pidfile"
}

# What the node may change on this host, normalized, one item a line: compare it before a node
# starts and after it stops.
host_state() {
  local -
  set +e +o pipefail
  echo "## sysctls"
  sysctl -a 2>/dev/null | grep -E '^(kernel\.(panic|panic_on_oops|keys\.)|vm\.(overcommit|panic_on_oom)|net\.ipv4\.(ip_forward|conf\.)|net\.ipv6\.conf\.|net\.bridge\.)' |
    grep -vE '\.(stable_secret|base_reachable_time|.*counter)' | sort
  echo "## nft ruleset"
  nft list ruleset 2>/dev/null | sed 's/ # handle [0-9]*//'
  echo "## links"
  ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | sort
  echo "## addresses"
  ip -o addr show | awk '{print $2, $3, $4}' | sort
  echo "## routes"
  ip route show table all 2>/dev/null | grep -v '^local\|^broadcast\|^multicast' | sort
  echo "## network namespaces"
  ls /run/netns 2>/dev/null || true
  echo "## mounts"
  awk '{print $5, $9}' /proc/self/mountinfo | sort
  echo "## cgroups"
  # Top-level cgroups of every hierarchy (where the kubelet puts kubepods; deeper ones belong to
  # whoever made their parent).
  find /sys/fs/cgroup -mindepth 2 -maxdepth 2 -type d 2>/dev/null | sort
  echo "## paths"
  local p
  for p in "${node_host_paths[@]}"; do [ -e "$p" ] && echo "$p"; done
  echo "## processes"
  ps -eo stat=,comm= | awk '$1 !~ /^Z/ {print $2}' |
    grep -E '^(containerd|containerd-shim|kubelet|kube-scheduler|runc|pause)' | sort | uniq -c || true
}
