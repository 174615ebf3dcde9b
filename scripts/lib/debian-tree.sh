# shellcheck shell=bash
# A Debian bookworm minbase tree for a container image, from this machine's
# apt mirrors and package lists, with bookworm-updates and bookworm-security
# applied, trimmed of what a container never reads. Sourced after
# scripts/lib/common.sh by the image builds; the caller sets WORK (a scratch
# directory) and DEBS (where downloaded .debs are kept between builds).
# (scripts/build-kube-images holds its own copy of these steps, so that its
# recipe hash, and with it the squid image, stays as it is.)

DEBIAN_SUITE=bookworm

# find_suites: this machine's package lists of bookworm, -updates and
# -security (main, amd64) as "URI SUITE LISTFILE" in SUITES; MIRROR is
# bookworm's URI.
find_suites() {
  # shellcheck disable=SC2016 # $(...) are apt's own placeholders
  mapfile -t SUITES < <(apt-get indextargets --format '$(CREATED_BY) $(COMPONENT) $(ARCHITECTURE) $(REPO_URI) $(RELEASE) $(FILENAME)' |
    awk -v s="$DEBIAN_SUITE" '$1 == "Packages" && $2 == "main" && $3 == "amd64" &&
      ($5 == s || $5 == s "-updates" || $5 == s "-security") {print $4, $5, $6}' | sort -u -k2,2)
  MIRROR=$(printf '%s\n' "${SUITES[@]}" | awk -v s="$DEBIAN_SUITE" '$2 == s {print $1}')
  [[ -n $MIRROR ]] || {
    echo "apt on this machine has no package list of $DEBIAN_SUITE main amd64: add it and run apt-get update"
    return 1
  }
  printf '%s\n' "${SUITES[@]}"
}

# debian_tree TREE PACKAGES: debootstrap minbase with PACKAGES (comma list),
# then the updates, without starting any service.
debian_tree() {
  local tree=$1 include=$2 line uri suite file f
  if ! nice -n 10 debootstrap --variant=minbase --cache-dir="$DEBS" --include="$include" \
    "$DEBIAN_SUITE" "$tree" "$MIRROR"; then
    [[ ! -f $tree/debootstrap/debootstrap.log ]] || tail -n 30 "$tree/debootstrap/debootstrap.log"
    return 1
  fi
  for line in "${SUITES[@]}"; do
    read -r uri suite file <<<"$line"
    echo "deb $uri $suite main"
  done >"$tree/etc/apt/sources.list"
  rm -f "$tree"/var/lib/apt/lists/*_{Packages,Release,InRelease}*
  for line in "${SUITES[@]}"; do
    read -r uri suite file <<<"$line"
    for f in "$file" "${file%%_dists_*}_dists_${suite}_"{InRelease,Release,Release.gpg}; do
      [[ ! -f $f ]] || cp "$f" "$tree/var/lib/apt/lists/"
    done
  done
  printf '#!/bin/sh\nexit 101\n' >"$tree/usr/sbin/policy-rc.d"
  chmod 0755 "$tree/usr/sbin/policy-rc.d"
  mount -t proc proc "$tree/proc"
  nice -n 10 chroot "$tree" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive apt-get -y -q -o APT::Install-Recommends=false \
    -o APT::Sandbox::User=root -o Dpkg::Options::=--force-confold -o Dpkg::Use-Pty=false full-upgrade \
    || { umount "$tree/proc"; return 1; }
  umount "$tree/proc"
  rm -f "$tree/usr/sbin/policy-rc.d"
  find "$tree/var/cache/apt/archives" -maxdepth 1 -name '*.deb' -exec mv -f -t "$DEBS/" {} +
}

# trim_tree TREE: no package lists, caches, docs, man pages, translations,
# logs or device nodes; the resolver and host name are the runtime's.
trim_tree() {
  local tree=$1
  rm -rf "$tree"/var/lib/apt/lists/* "$tree"/var/cache/debconf/*-old "$tree"/var/lib/dpkg/*-old \
    "$tree"/tmp/* "$tree"/var/tmp/* "${tree:?}"/dev/* "$tree"/var/cache/ldconfig/aux-cache \
    "$tree"/usr/share/{man,info,lintian}/* "$tree/debootstrap"
  find "$tree/var/cache/apt" "$tree/var/log" -type f -delete
  find "$tree/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  find "$tree/usr/share/doc" -mindepth 1 -type d -empty -delete
  find "$tree/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
  : >"$tree/etc/resolv.conf"
  echo localhost >"$tree/etc/hostname"
}
