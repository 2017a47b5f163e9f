"""Keys of the messages exchanged between our strategies and ClientApps.

Flower's conventions are kept: the model travels in the ArrayRecord "arrays", the
round's settings in the ConfigRecord "config", and replies carry one ArrayRecord
"arrays" and one MetricRecord "metrics" holding "num-examples". Everything a client
needs for a round travels in the message, so clients stay stateless — except LocalGHBM and FedHBM, whose
clients keep node-local state files (:mod:`strategies.client_state`).
"""

# --- train message -------------------------------------------------------------------
ARRAYS = "arrays"  # ArrayRecord: global model theta^{t-1}
CONFIG = "config"  # ConfigRecord: the keys below
FEDCM_CORRECTION = "fedcm-correction"  # ArrayRecord: beta (theta^{t-1} - theta^{t-2}) / eta_t (FedCM only)
GHBM_MOMENTUM = "ghbm-momentum"  # ArrayRecord: m^t = (theta^{t-1-tau} - theta^{t-1}) / tau, zero in rounds <= tau

ALGORITHM = "algorithm"  # str: a name of strategies.client_step.ALGORITHMS
SERVER_ROUND = "server-round"  # int
CLIENT_LR = "client-lr"  # float: eta_l (FedAvgM/FedCM) or gamma (LocalUpdate), already decayed
SERVER_LR = "server-lr"  # float: eta_t of this round (informative; FedCM's term already uses it)
MOMENTUM = "momentum"  # float: beta (FedCM's local step needs it)
THETA = "theta"  # str preset ("fedavg" / "fomaml", K from LOCAL_STEPS or epochs) or list[float] (K = len)
LOCAL_EPOCHS = "local-epochs"  # int: E (ignored when LOCAL_STEPS > 0)
LOCAL_STEPS = "local-steps"  # int: J; 0 means "E epochs of the client's data"
PARTICIPATION = "participation"  # float: C, FedHBM's momentum scale C (a_i - theta_{i,k})
# client state of LocalGHBM / FedHBM (strategies/client_state.py; the only stateful clients, docs/ghbm.md)
STATE_DIR = "client-state-dir"  # str: root of the node-local state files (node_config may override it)
STATE_RUN = "client-state-run"  # str: run identity, created at a fresh start and kept in the checkpoint
STATE_STARTS = "client-state-starts"  # list[int]: first round of each server start (fresh start, resumes)
STATE_IDS = "client-state-ids"  # list[str]: identity of each server start; a state file is valid in its segment
STATE_KEEP = "client-state-keep"  # int: last checkpointed round (states a resume may need are kept)
STATE_MEMORY = "client-state-memory"  # node_config int: pid of the in-process engine whose nodes keep states in memory

# --- train reply ---------------------------------------------------------------------
METRICS = "metrics"  # MetricRecord
NUM_EXAMPLES = "num-examples"  # int: weight of the reply
LOSS_BEFORE = "loss-before"  # float: client loss of the received model (LocalUpdateDecay monitors it)
TRAIN_LOSS = "train-loss"  # float: mean loss over the local steps
NUM_STEPS = "num-steps"  # int: local steps taken (J)
NONFINITE = "nonfinite"  # int: 1 when the client's local training met a NaN/inf (the server rejects the reply)
PARTITION_ID = "partition-id"  # int: reply to the QUERY message used to map nodes to partitions
NUM_PARTITIONS = "num-partitions"  # int: the node's N, also in its reply to the QUERY message (checked)
STATE_ROUNDS = "state-rounds"  # int: rounds since the client state used (0 = first participation; LocalGHBM/FedHBM)
STATE_INVALID = "state-invalid"  # int: 1 when a stored client state was corrupt and ignored

# --- round metrics: the MetricRecord of aggregate_train (besides SERVER_LR, CLIENT_LR, TRAIN_LOSS, LOSS_BEFORE) ----
NUM_SELECTED = "num-selected"  # int: nodes sent a train message this round
NUM_REPLIES = "num-replies"  # int: accepted replies
NUM_REJECTED = "num-rejected"  # int: replies that failed validation
NUM_FAILURES = "num-failures"  # int: error or missing replies
UPDATE_NORM = "update-norm"  # float: ||Delta^t||_2 (||mean q||_2 for LocalUpdate*)
CLIENT_UPDATE_NORM = "client-update-norm"  # float: example-weighted mean of the clients' update norms
NUM_SKIPPED = "num-skipped"  # int: scheduled partitions with no connected node (client manager)
NUM_REFUSED = "num-refused"  # int: partition claims refused (client manager)
NUM_REASSIGNED = "num-reassigned"  # int: partitions whose node changed (client manager)
NUM_SILENT = "num-silent"  # int: nodes not waited for this round (client manager)
