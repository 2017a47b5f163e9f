"""Keys of the messages exchanged between our strategies and ClientApps.

Flower's conventions are kept: the model travels in the ArrayRecord "arrays", the
round's settings in the ConfigRecord "config", and replies carry one ArrayRecord
"arrays" and one MetricRecord "metrics" holding "num-examples". Everything a client
needs for a round travels in the message, so clients stay stateless.
"""

# --- train message -------------------------------------------------------------------
ARRAYS = "arrays"  # ArrayRecord: global model theta^{t-1}
CONFIG = "config"  # ConfigRecord: the keys below
FEDCM_CORRECTION = "fedcm-correction"  # ArrayRecord: beta (theta^{t-1} - theta^{t-2}) / eta_t (FedCM only)

ALGORITHM = "algorithm"  # str: "fedavgm" | "fedcm" | "localupdate"
SERVER_ROUND = "server-round"  # int
CLIENT_LR = "client-lr"  # float: eta_l (FedAvgM/FedCM) or gamma (LocalUpdate), already decayed
SERVER_LR = "server-lr"  # float: eta_t of this round (informative; FedCM's term already uses it)
MOMENTUM = "momentum"  # float: beta (FedCM's local step needs it)
THETA = "theta"  # str preset ("fedavg" / "fomaml", K from LOCAL_STEPS or epochs) or list[float] (K = len)
LOCAL_EPOCHS = "local-epochs"  # int: E (ignored when LOCAL_STEPS > 0)
LOCAL_STEPS = "local-steps"  # int: J; 0 means "E epochs of the client's data"

# --- train reply ---------------------------------------------------------------------
METRICS = "metrics"  # MetricRecord
NUM_EXAMPLES = "num-examples"  # int: weight of the reply
LOSS_BEFORE = "loss-before"  # float: client loss of the received model (LocalUpdateDecay monitors it)
TRAIN_LOSS = "train-loss"  # float: mean loss over the local steps
NUM_STEPS = "num-steps"  # int: local steps taken (J)
NONFINITE = "nonfinite"  # int: 1 when the client's local training met a NaN/inf (the server rejects the reply)
PARTITION_ID = "partition-id"  # int: reply to the QUERY message used to map nodes to partitions

ALGORITHMS = ("fedavgm", "fedcm", "localupdate")
