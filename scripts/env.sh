# Sourced by the scripts: quiet, offline-safe defaults (override by exporting before).
# The network may be closed: telemetry and analytics would only fail noisily.
export PREFECT_SERVER_ANALYTICS_ENABLED="${PREFECT_SERVER_ANALYTICS_ENABLED:-false}"
export DO_NOT_TRACK="${DO_NOT_TRACK:-1}"
export DVC_NO_ANALYTICS="${DVC_NO_ANALYTICS:-1}"
export HF_HUB_DISABLE_TELEMETRY="${HF_HUB_DISABLE_TELEMETRY:-1}"
export TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"
