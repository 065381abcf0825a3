-- ws-tune schema v0.2.0.a, frozen: written by ws-tune 0.2.0's migrations, with a trial and an Optuna
-- study (tests/server/test_reliability_migrations.py). Never regenerate: newer schemas must upgrade this.
BEGIN TRANSACTION;
CREATE TABLE alembic_version (
	version_num VARCHAR(32) NOT NULL, 
	CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num)
);
INSERT INTO "alembic_version" VALUES('v3.2.0.a');
CREATE TABLE studies (
	study_id INTEGER NOT NULL, 
	study_name VARCHAR(512) NOT NULL, 
	PRIMARY KEY (study_id)
);
INSERT INTO "studies" VALUES(1,'frozen');
CREATE TABLE study_directions (
	study_direction_id INTEGER NOT NULL, 
	direction VARCHAR(8) NOT NULL, 
	study_id INTEGER NOT NULL, 
	objective INTEGER NOT NULL, 
	PRIMARY KEY (study_direction_id), 
	UNIQUE (study_id, objective), 
	FOREIGN KEY(study_id) REFERENCES studies (study_id)
);
INSERT INTO "study_directions" VALUES(1,'MINIMIZE',1,0);
CREATE TABLE study_system_attributes (
	study_system_attribute_id INTEGER NOT NULL, 
	study_id INTEGER, 
	"key" VARCHAR(512), 
	value_json TEXT, 
	PRIMARY KEY (study_system_attribute_id), 
	UNIQUE (study_id, "key"), 
	FOREIGN KEY(study_id) REFERENCES studies (study_id)
);
CREATE TABLE study_user_attributes (
	study_user_attribute_id INTEGER NOT NULL, 
	study_id INTEGER, 
	"key" VARCHAR(512), 
	value_json TEXT, 
	PRIMARY KEY (study_user_attribute_id), 
	UNIQUE (study_id, "key"), 
	FOREIGN KEY(study_id) REFERENCES studies (study_id)
);
CREATE TABLE trial_heartbeats (
	trial_heartbeat_id INTEGER NOT NULL, 
	trial_id INTEGER NOT NULL, 
	heartbeat DATETIME NOT NULL, 
	PRIMARY KEY (trial_heartbeat_id), 
	UNIQUE (trial_id), 
	FOREIGN KEY(trial_id) REFERENCES trials (trial_id)
);
CREATE TABLE trial_intermediate_values (
	trial_intermediate_value_id INTEGER NOT NULL, 
	trial_id INTEGER NOT NULL, 
	step INTEGER NOT NULL, 
	intermediate_value FLOAT, 
	intermediate_value_type VARCHAR(7) NOT NULL, 
	PRIMARY KEY (trial_intermediate_value_id), 
	UNIQUE (trial_id, step), 
	FOREIGN KEY(trial_id) REFERENCES trials (trial_id)
);
CREATE TABLE trial_params (
	param_id INTEGER NOT NULL, 
	trial_id INTEGER, 
	param_name VARCHAR(512), 
	param_value FLOAT, 
	distribution_json TEXT, 
	PRIMARY KEY (param_id), 
	UNIQUE (trial_id, param_name), 
	FOREIGN KEY(trial_id) REFERENCES trials (trial_id)
);
INSERT INTO "trial_params" VALUES(1,1,'x',5.48813503927324752851e-01,'{"name": "FloatDistribution", "attributes": {"step": null, "low": 0.0, "high": 1.0, "log": false}}');
INSERT INTO "trial_params" VALUES(2,2,'x',7.1518936637241947718e-01,'{"name": "FloatDistribution", "attributes": {"step": null, "low": 0.0, "high": 1.0, "log": false}}');
INSERT INTO "trial_params" VALUES(3,3,'x',6.02763376071643874887e-01,'{"name": "FloatDistribution", "attributes": {"step": null, "low": 0.0, "high": 1.0, "log": false}}');
CREATE TABLE trial_system_attributes (
	trial_system_attribute_id INTEGER NOT NULL, 
	trial_id INTEGER, 
	"key" VARCHAR(512), 
	value_json TEXT, 
	PRIMARY KEY (trial_system_attribute_id), 
	UNIQUE (trial_id, "key"), 
	FOREIGN KEY(trial_id) REFERENCES trials (trial_id)
);
CREATE TABLE trial_user_attributes (
	trial_user_attribute_id INTEGER NOT NULL, 
	trial_id INTEGER, 
	"key" VARCHAR(512), 
	value_json TEXT, 
	PRIMARY KEY (trial_user_attribute_id), 
	UNIQUE (trial_id, "key"), 
	FOREIGN KEY(trial_id) REFERENCES trials (trial_id)
);
CREATE TABLE trial_values (
	trial_value_id INTEGER NOT NULL, 
	trial_id INTEGER NOT NULL, 
	objective INTEGER NOT NULL, 
	value FLOAT, 
	value_type VARCHAR(7) NOT NULL, 
	PRIMARY KEY (trial_value_id), 
	UNIQUE (trial_id, objective), 
	FOREIGN KEY(trial_id) REFERENCES trials (trial_id)
);
INSERT INTO "trial_values" VALUES(1,1,0,5.48813503927324752851e-01,'FINITE');
INSERT INTO "trial_values" VALUES(2,2,0,7.1518936637241947718e-01,'FINITE');
INSERT INTO "trial_values" VALUES(3,3,0,6.02763376071643874887e-01,'FINITE');
CREATE TABLE trials (
	trial_id INTEGER NOT NULL, 
	number INTEGER, 
	study_id INTEGER, 
	state VARCHAR(8) NOT NULL, 
	datetime_start DATETIME, 
	datetime_complete DATETIME, 
	PRIMARY KEY (trial_id), 
	FOREIGN KEY(study_id) REFERENCES studies (study_id)
);
INSERT INTO "trials" VALUES(1,0,1,'COMPLETE','2026-11-30 06:46:05.989717','2026-11-30 06:46:06.014295');
INSERT INTO "trials" VALUES(2,1,1,'COMPLETE','2026-11-30 06:46:06.024246','2026-11-30 06:46:06.033349');
INSERT INTO "trials" VALUES(3,2,1,'COMPLETE','2026-11-30 06:46:06.041535','2026-11-30 06:46:06.050122');
CREATE TABLE version_info (
	version_info_id INTEGER NOT NULL, 
	schema_version INTEGER, 
	library_version VARCHAR(256), 
	PRIMARY KEY (version_info_id), 
	CHECK (version_info_id=1)
);
INSERT INTO "version_info" VALUES(1,12,'5.0.0');
CREATE TABLE ws_tune_alembic_version (
	version_num VARCHAR(32) NOT NULL, 
	CONSTRAINT ws_tune_alembic_version_pkc PRIMARY KEY (version_num)
);
INSERT INTO "ws_tune_alembic_version" VALUES('v0.2.0.a');
CREATE TABLE ws_tune_candidates (
	id INTEGER NOT NULL, 
	hash VARCHAR(64) NOT NULL, 
	lowering VARCHAR(32) NOT NULL, 
	params TEXT NOT NULL, 
	schedule TEXT, 
	created_at DATETIME DEFAULT CURRENT_TIMESTAMP NOT NULL, 
	CONSTRAINT pk_ws_tune_candidates PRIMARY KEY (id), 
	CONSTRAINT uq_ws_tune_candidates_hash UNIQUE (hash)
);
INSERT INTO "ws_tune_candidates" VALUES(1,'c0ffee0000000000cafe','default','{"block_M":128}',NULL,'2026-11-30 06:46:05');
CREATE TABLE ws_tune_job_trials (
	id INTEGER NOT NULL, 
	job_id INTEGER NOT NULL, 
	slot INTEGER, 
	kind VARCHAR(32) NOT NULL, 
	state VARCHAR(32) NOT NULL, 
	attempts INTEGER DEFAULT '0' NOT NULL, 
	epoch INTEGER DEFAULT '0' NOT NULL, 
	worker_id VARCHAR(64), 
	heartbeat_at DATETIME, 
	candidate_hash VARCHAR(64), 
	candidate TEXT, 
	decisions TEXT, 
	optuna_trial INTEGER, 
	workload_id INTEGER, 
	status VARCHAR(32), 
	message TEXT, 
	median_ms FLOAT, 
	tflops FLOAT, 
	created_at DATETIME DEFAULT CURRENT_TIMESTAMP NOT NULL, 
	finished_at DATETIME, 
	CONSTRAINT pk_ws_tune_job_trials PRIMARY KEY (id), 
	CONSTRAINT fk_ws_tune_job_trials_job_id_ws_tune_jobs FOREIGN KEY(job_id) REFERENCES ws_tune_jobs (id) ON DELETE CASCADE, 
	CONSTRAINT uq_ws_tune_job_trials_job_slot UNIQUE (job_id, slot), 
	CONSTRAINT uq_ws_tune_job_trials_job_candidate UNIQUE (job_id, candidate_hash)
);
CREATE TABLE ws_tune_jobs (
	id INTEGER NOT NULL, 
	state VARCHAR(32) NOT NULL, 
	kernel_id INTEGER NOT NULL, 
	kernel VARCHAR(256) NOT NULL, 
	problem TEXT NOT NULL, 
	problem_checked BOOLEAN DEFAULT 0 NOT NULL, 
	params TEXT, 
	strategy VARCHAR(32) NOT NULL, 
	seed INTEGER NOT NULL, 
	budget INTEGER NOT NULL, 
	time_budget FLOAT, 
	baselines BOOLEAN DEFAULT 0 NOT NULL, 
	device VARCHAR(256), 
	workload_id INTEGER, 
	slots_claimed INTEGER DEFAULT '0' NOT NULL, 
	exhausted BOOLEAN DEFAULT 0 NOT NULL, 
	error TEXT, 
	created_by INTEGER, 
	created_at DATETIME DEFAULT CURRENT_TIMESTAMP NOT NULL, 
	updated_at DATETIME DEFAULT CURRENT_TIMESTAMP NOT NULL, 
	started_at DATETIME, 
	finished_at DATETIME, 
	CONSTRAINT pk_ws_tune_jobs PRIMARY KEY (id), 
	CONSTRAINT fk_ws_tune_jobs_kernel_id_ws_tune_kernels FOREIGN KEY(kernel_id) REFERENCES ws_tune_kernels (id), 
	CONSTRAINT fk_ws_tune_jobs_workload_id_ws_tune_workloads FOREIGN KEY(workload_id) REFERENCES ws_tune_workloads (id) ON DELETE SET NULL, 
	CONSTRAINT fk_ws_tune_jobs_created_by_ws_tune_tokens FOREIGN KEY(created_by) REFERENCES ws_tune_tokens (id) ON DELETE SET NULL
);
CREATE TABLE ws_tune_kernels (
	id INTEGER NOT NULL, 
	sha256 VARCHAR(64) NOT NULL, 
	name VARCHAR(256) NOT NULL, 
	source TEXT NOT NULL, 
	size_bytes INTEGER NOT NULL, 
	problem TEXT, 
	registered BOOLEAN DEFAULT 0 NOT NULL, 
	registered_at DATETIME, 
	created_at DATETIME DEFAULT CURRENT_TIMESTAMP NOT NULL, 
	CONSTRAINT pk_ws_tune_kernels PRIMARY KEY (id), 
	CONSTRAINT uq_ws_tune_kernels_sha256 UNIQUE (sha256)
);
CREATE TABLE ws_tune_tokens (
	id INTEGER NOT NULL, 
	name VARCHAR(256) NOT NULL, 
	token_hash VARCHAR(64) NOT NULL, 
	prefix VARCHAR(32) NOT NULL, 
	scopes VARCHAR(256) NOT NULL, 
	created_at DATETIME DEFAULT CURRENT_TIMESTAMP NOT NULL, 
	revoked_at DATETIME, 
	CONSTRAINT pk_ws_tune_tokens PRIMARY KEY (id), 
	CONSTRAINT uq_ws_tune_tokens_token_hash UNIQUE (token_hash)
);
CREATE TABLE ws_tune_trials (
	id INTEGER NOT NULL, 
	workload_id INTEGER NOT NULL, 
	candidate_id INTEGER NOT NULL, 
	status VARCHAR(32) NOT NULL, 
	message TEXT NOT NULL, 
	build_seconds FLOAT, 
	median_ms FLOAT, 
	p20_ms FLOAT, 
	p80_ms FLOAT, 
	reps INTEGER, 
	tflops FLOAT, 
	info TEXT NOT NULL, 
	created_at DATETIME DEFAULT CURRENT_TIMESTAMP NOT NULL, 
	updated_at DATETIME DEFAULT CURRENT_TIMESTAMP NOT NULL, 
	CONSTRAINT pk_ws_tune_trials PRIMARY KEY (id), 
	CONSTRAINT fk_ws_tune_trials_workload_id_ws_tune_workloads FOREIGN KEY(workload_id) REFERENCES ws_tune_workloads (id) ON DELETE CASCADE, 
	CONSTRAINT fk_ws_tune_trials_candidate_id_ws_tune_candidates FOREIGN KEY(candidate_id) REFERENCES ws_tune_candidates (id), 
	CONSTRAINT uq_ws_tune_trials_workload_candidate UNIQUE (workload_id, candidate_id)
);
INSERT INTO "ws_tune_trials" VALUES(1,1,1,'ok','',1.5,0.5,0.49,0.51,30,275.0,'{"role":"search"}','2026-11-30 06:46:05','2026-11-30 06:46:05');
CREATE TABLE ws_tune_workers (
	id VARCHAR(64) NOT NULL, 
	host VARCHAR(256) NOT NULL, 
	pid INTEGER NOT NULL, 
	gpu INTEGER, 
	device VARCHAR(256) NOT NULL, 
	state VARCHAR(32) NOT NULL, 
	job_id INTEGER, 
	started_at DATETIME DEFAULT CURRENT_TIMESTAMP NOT NULL, 
	heartbeat_at DATETIME DEFAULT CURRENT_TIMESTAMP NOT NULL, 
	stopped_at DATETIME, 
	CONSTRAINT pk_ws_tune_workers PRIMARY KEY (id)
);
CREATE TABLE ws_tune_workloads (
	id INTEGER NOT NULL, 
	key_hash VARCHAR(64) NOT NULL, 
	kernel VARCHAR(256) NOT NULL, 
	source_hash VARCHAR(64) NOT NULL, 
	problem TEXT NOT NULL, 
	arch VARCHAR(32) NOT NULL, 
	device VARCHAR(256) NOT NULL, 
	tilelang_version VARCHAR(256) NOT NULL, 
	cuda_version VARCHAR(256) NOT NULL, 
	driver_version VARCHAR(256) NOT NULL, 
	created_at DATETIME DEFAULT CURRENT_TIMESTAMP NOT NULL, 
	CONSTRAINT pk_ws_tune_workloads PRIMARY KEY (id), 
	CONSTRAINT uq_ws_tune_workloads_key_hash UNIQUE (key_hash)
);
INSERT INTO "ws_tune_workloads" VALUES(1,'k1','gemm','abababababababababababababababababababababababababababababababab','{"K":4096,"M":4096,"N":4096,"b_layout":"row","dtype":"float16"}','sm_90a','NVIDIA H200','0.1.15','12.8','570.1','2026-11-30 06:46:05');
CREATE INDEX ix_ws_tune_workloads_kernel ON ws_tune_workloads (kernel);
CREATE INDEX ix_ws_tune_trials_workload_status_median ON ws_tune_trials (workload_id, status, median_ms);
CREATE INDEX ix_ws_tune_kernels_name ON ws_tune_kernels (name);
CREATE INDEX ix_ws_tune_jobs_state_id ON ws_tune_jobs (state, id);
CREATE INDEX ix_ws_tune_job_trials_job_state ON ws_tune_job_trials (job_id, state);
CREATE INDEX ix_ws_tune_job_trials_state_heartbeat ON ws_tune_job_trials (state, heartbeat_at);
CREATE UNIQUE INDEX ix_studies_study_name ON studies (study_name);
CREATE INDEX ix_trials_study_id ON trials (study_id);
COMMIT;
