"""The host's side of a job process, torch-free: the contract between the two (the job spec, the JSON lines
and files, the model signature, the job-kind table, error text) and how a job process is started and
confined (launcher, sandbox, bubblewrap, seccomp). The API, the worker and `amct compress` import it; the job
process itself (job_process/) imports it for the contract, never the other way round."""
